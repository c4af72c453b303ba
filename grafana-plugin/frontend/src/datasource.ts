import { CoreApp, DataSourceInstanceSettings, ScopedVars, TimeRange, getDefaultTimeRange } from '@grafana/data';
import { DataSourceWithBackend, getTemplateSrv } from '@grafana/runtime';

import { DEFAULT_QUERY, KilnOptions, KilnQuery, ProfileType } from './types';

/** Query parameters of the backend's resource calls (CallResource). Times are Unix milliseconds. */
export interface ResourceParams {
  start: number;
  end: number;
  matchers?: string;
  label?: string;
}

function rangeParams(range?: TimeRange): { start: number; end: number } {
  const r = range ?? getDefaultTimeRange();
  return { start: r.from.valueOf(), end: r.to.valueOf() };
}

function normalizeSelector(selector: string | undefined): string {
  const s = (selector ?? '').trim();
  return s === '' ? '{}' : s;
}

function asStringArray(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : [];
}

export class DataSource extends DataSourceWithBackend<KilnQuery, KilnOptions> {
  constructor(instanceSettings: DataSourceInstanceSettings<KilnOptions>) {
    super(instanceSettings);
  }

  getDefaultQuery(_app: CoreApp): Partial<KilnQuery> {
    return { ...DEFAULT_QUERY, groupBy: [] };
  }

  /** Queries without a profile type are not sent to the backend. */
  filterQuery(query: KilnQuery): boolean {
    return !query.hide && typeof query.profileTypeId === 'string' && query.profileTypeId.trim() !== '';
  }

  applyTemplateVariables(query: KilnQuery, scopedVars: ScopedVars): KilnQuery {
    const t = getTemplateSrv();
    return {
      ...query,
      profileTypeId: t.replace(query.profileTypeId ?? '', scopedVars),
      labelSelector: normalizeSelector(t.replace(query.labelSelector ?? '', scopedVars)),
      groupBy: (query.groupBy ?? []).map((g) => t.replace(g, scopedVars)).filter((g) => g !== ''),
    };
  }

  /** `GET …/resources/profileTypes?start=&end=` → profile types known to Kiln. */
  async getProfileTypes(range?: TimeRange): Promise<ProfileType[]> {
    const params: ResourceParams = rangeParams(range);
    const res = await this.getResource<ProfileType[]>('profileTypes', params);
    return Array.isArray(res) ? res : [];
  }

  /** `GET …/resources/labelNames?matchers=<selector>&start=&end=` → label names. */
  async getLabelNames(selector: string, range?: TimeRange): Promise<string[]> {
    const params: ResourceParams = {
      matchers: normalizeSelector(getTemplateSrv().replace(selector ?? '')),
      ...rangeParams(range),
    };
    return asStringArray(await this.getResource<string[]>('labelNames', params));
  }

  /** `GET …/resources/labelValues?label=<name>&matchers=<selector>&start=&end=` → values of one label. */
  async getLabelValues(name: string, selector: string, range?: TimeRange): Promise<string[]> {
    const params: ResourceParams = {
      label: name,
      matchers: normalizeSelector(getTemplateSrv().replace(selector ?? '')),
      ...rangeParams(range),
    };
    return asStringArray(await this.getResource<string[]>('labelValues', params));
  }
}
