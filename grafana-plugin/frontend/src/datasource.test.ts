import { CoreApp, DataSourceInstanceSettings, dateTime, TimeRange } from '@grafana/data';
import { setTemplateSrv, TemplateSrv } from '@grafana/runtime';

import { DataSource } from './datasource';
import { KilnOptions, KilnQuery } from './types';

const settings = {
  id: 1,
  uid: 'kiln-uid',
  type: 'kiln-profiles-datasource',
  name: 'Kiln',
  access: 'proxy',
  readOnly: false,
  jsonData: { url: 'http://kiln:4040' },
  meta: {},
} as unknown as DataSourceInstanceSettings<KilnOptions>;

const range: TimeRange = {
  from: dateTime(1_700_000_000_000),
  to: dateTime(1_700_003_600_000),
  raw: { from: 'now-1h', to: 'now' },
};

const vars: Record<string, string> = { service: 'api', label: 'region' };
const templateSrv = {
  replace: (target?: string) => (target ?? '').replace(/\$(\w+)/g, (m, name) => vars[name] ?? m),
  getVariables: () => [],
  containsTemplate: (t?: string) => !!t && t.includes('$'),
  updateTimeRange: () => {},
} as unknown as TemplateSrv;

function query(partial: Partial<KilnQuery>): KilnQuery {
  return { refId: 'A', queryType: 'both', profileTypeId: '', labelSelector: '{}', groupBy: [], ...partial };
}

describe('DataSource', () => {
  let ds: DataSource;
  let getResource: jest.SpyInstance;

  beforeEach(() => {
    setTemplateSrv(templateSrv);
    ds = new DataSource(settings);
    getResource = jest.spyOn(ds, 'getResource');
  });

  afterEach(() => jest.restoreAllMocks());

  it('getDefaultQuery returns the documented defaults', () => {
    expect(ds.getDefaultQuery(CoreApp.Explore)).toEqual({ queryType: 'both', labelSelector: '{}', groupBy: [] });
    // A fresh object each time: editors may mutate what they get.
    expect(ds.getDefaultQuery(CoreApp.Dashboard).groupBy).not.toBe(ds.getDefaultQuery(CoreApp.Dashboard).groupBy);
  });

  it('filterQuery skips queries without a profile type', () => {
    expect(ds.filterQuery(query({ profileTypeId: '' }))).toBe(false);
    expect(ds.filterQuery(query({ profileTypeId: '   ' }))).toBe(false);
    expect(ds.filterQuery({ refId: 'A' } as KilnQuery)).toBe(false);
    expect(ds.filterQuery(query({ profileTypeId: 'process_cpu:cpu:nanoseconds:cpu:nanoseconds' }))).toBe(true);
    expect(ds.filterQuery(query({ profileTypeId: 'process_cpu:cpu:nanoseconds:cpu:nanoseconds', hide: true }))).toBe(
      false
    );
  });

  it('applyTemplateVariables interpolates selector, profile type and group-by', () => {
    const out = ds.applyTemplateVariables(
      query({ profileTypeId: 'p:$service', labelSelector: '{service_name="$service"}', groupBy: ['$label', 'host'] }),
      {}
    );
    expect(out.profileTypeId).toBe('p:api');
    expect(out.labelSelector).toBe('{service_name="api"}');
    expect(out.groupBy).toEqual(['region', 'host']);
    expect(ds.applyTemplateVariables(query({ labelSelector: '  ' }), {}).labelSelector).toBe('{}');
  });

  it('getProfileTypes calls the profileTypes resource with the time range in ms', async () => {
    const types = [
      {
        id: 'process_cpu:cpu:nanoseconds:cpu:nanoseconds',
        name: 'process_cpu',
        sampleType: 'cpu',
        sampleUnit: 'nanoseconds',
        periodType: 'cpu',
        periodUnit: 'nanoseconds',
      },
    ];
    getResource.mockResolvedValue(types);
    await expect(ds.getProfileTypes(range)).resolves.toEqual(types);
    expect(getResource).toHaveBeenCalledTimes(1);
    expect(getResource).toHaveBeenCalledWith('profileTypes', { start: 1_700_000_000_000, end: 1_700_003_600_000 });
  });

  it('getProfileTypes without a range still sends start/end', async () => {
    getResource.mockResolvedValue(null);
    await expect(ds.getProfileTypes()).resolves.toEqual([]);
    const [path, params] = getResource.mock.calls[0];
    expect(path).toBe('profileTypes');
    expect(typeof params.start).toBe('number');
    expect(typeof params.end).toBe('number');
    expect(params.end).toBeGreaterThan(params.start);
  });

  it('getLabelNames sends matchers, start and end', async () => {
    getResource.mockResolvedValue(['service_name', 'region']);
    await expect(ds.getLabelNames('{service_name="$service"}', range)).resolves.toEqual(['service_name', 'region']);
    expect(getResource).toHaveBeenCalledWith('labelNames', {
      matchers: '{service_name="api"}',
      start: 1_700_000_000_000,
      end: 1_700_003_600_000,
    });
  });

  it('getLabelNames sends {} for an empty selector and drops non-strings', async () => {
    getResource.mockResolvedValue(['a', 3, null, 'b']);
    await expect(ds.getLabelNames('', range)).resolves.toEqual(['a', 'b']);
    expect(getResource.mock.calls[0][1].matchers).toBe('{}');
  });

  it('getLabelValues sends label, matchers, start and end', async () => {
    getResource.mockResolvedValue(['api', 'web']);
    await expect(ds.getLabelValues('service_name', '{region="eu"}', range)).resolves.toEqual(['api', 'web']);
    expect(getResource).toHaveBeenCalledWith('labelValues', {
      label: 'service_name',
      matchers: '{region="eu"}',
      start: 1_700_000_000_000,
      end: 1_700_003_600_000,
    });
  });

  it('propagates resource errors', async () => {
    getResource.mockRejectedValue(new Error('boom'));
    await expect(ds.getLabelValues('x', '{}', range)).rejects.toThrow('boom');
  });
});
