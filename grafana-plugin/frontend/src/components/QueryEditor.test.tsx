import React from 'react';
import { act, fireEvent, render, screen, waitFor } from '@testing-library/react';
import { dateTime, TimeRange } from '@grafana/data';

import { DataSource } from '../datasource';
import { KilnQuery, ProfileType } from '../types';
import { QueryEditor } from './QueryEditor';

const PROFILE_TYPES: ProfileType[] = [
  {
    id: 'process_cpu:cpu:nanoseconds:cpu:nanoseconds',
    name: 'process_cpu',
    sampleType: 'cpu',
    sampleUnit: 'nanoseconds',
    periodType: 'cpu',
    periodUnit: 'nanoseconds',
  },
  {
    id: 'memory:alloc_space:bytes:space:bytes',
    name: 'memory',
    sampleType: 'alloc_space',
    sampleUnit: 'bytes',
    periodType: 'space',
    periodUnit: 'bytes',
  },
];

const range: TimeRange = {
  from: dateTime(1_700_000_000_000),
  to: dateTime(1_700_003_600_000),
  raw: { from: 'now-1h', to: 'now' },
};

function fakeDatasource() {
  return {
    getProfileTypes: jest.fn().mockResolvedValue(PROFILE_TYPES),
    getLabelNames: jest.fn().mockResolvedValue(['service_name', 'region']),
    getLabelValues: jest.fn().mockResolvedValue(['api', 'web']),
  };
}

function baseQuery(partial: Partial<KilnQuery> = {}): KilnQuery {
  return {
    refId: 'A',
    queryType: 'both',
    profileTypeId: 'process_cpu:cpu:nanoseconds:cpu:nanoseconds',
    labelSelector: '{}',
    groupBy: [],
    ...partial,
  };
}

async function setup(query: KilnQuery = baseQuery()) {
  const ds = fakeDatasource();
  const onChange = jest.fn();
  const onRunQuery = jest.fn();
  const utils = render(
    <QueryEditor
      datasource={ds as unknown as DataSource}
      query={query}
      onChange={onChange}
      onRunQuery={onRunQuery}
      range={range}
    />
  );
  // Let the initial resource calls resolve.
  await waitFor(() => expect(ds.getLabelNames).toHaveBeenCalled());
  await act(async () => {});
  return { ds, onChange, onRunQuery, ...utils };
}

async function openSelect(input: HTMLElement) {
  await act(async () => {
    fireEvent.focus(input);
    fireEvent.keyDown(input, { key: 'ArrowDown', code: 'ArrowDown', keyCode: 40 });
  });
}

describe('QueryEditor', () => {
  it('renders its fields and loads profile types and label names for the time range', async () => {
    const { ds } = await setup();
    expect(screen.getByTestId('kiln-query-editor')).toBeInTheDocument();
    expect(screen.getByLabelText('Label selector')).toHaveValue('{}');
    expect(screen.getByLabelText('Max nodes')).toBeInTheDocument();
    expect(screen.getByRole('radio', { name: 'Metrics' })).toBeInTheDocument();
    expect(ds.getProfileTypes).toHaveBeenCalledWith(range);
    expect(ds.getLabelNames).toHaveBeenCalledWith('{}', range);
    // The selected profile type is shown with its "name - sampleType" label.
    expect(await screen.findByText('process_cpu - cpu')).toBeInTheDocument();
  });

  it('lists profile types as "name - sampleType" and changes the profile type', async () => {
    const { onChange, onRunQuery } = await setup(baseQuery({ profileTypeId: '' }));
    await openSelect(screen.getByLabelText('Profile type'));
    fireEvent.click(await screen.findByText('memory - alloc_space'));
    expect(onChange).toHaveBeenCalledWith(
      expect.objectContaining({ profileTypeId: 'memory:alloc_space:bytes:space:bytes' })
    );
    expect(onRunQuery).toHaveBeenCalled();
  });

  it('calls onChange and onRunQuery when the query type changes', async () => {
    const { onChange, onRunQuery } = await setup();
    fireEvent.click(screen.getByRole('radio', { name: 'Metrics' }));
    expect(onChange).toHaveBeenCalledTimes(1);
    expect(onChange).toHaveBeenCalledWith(expect.objectContaining({ queryType: 'metrics', refId: 'A' }));
    expect(onRunQuery).toHaveBeenCalledTimes(1);

    fireEvent.click(screen.getByRole('radio', { name: 'Profile' }));
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ queryType: 'profile' }));
  });

  it('calls onChange when max nodes changes, and runs the query on blur', async () => {
    const { onChange, onRunQuery } = await setup(baseQuery({ maxNodes: 100 }));
    const input = screen.getByLabelText('Max nodes');
    expect(input).toHaveValue(100);
    fireEvent.change(input, { target: { value: '512' } });
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ maxNodes: 512 }));
    expect(onRunQuery).not.toHaveBeenCalled();
    fireEvent.blur(input);
    expect(onRunQuery).toHaveBeenCalledTimes(1);

    fireEvent.change(input, { target: { value: '' } });
    const last = onChange.mock.calls[onChange.mock.calls.length - 1][0] as KilnQuery;
    expect(last.maxNodes).toBeUndefined();
  });

  it('commits the tenants a query reads on blur', async () => {
    const { onChange, onRunQuery } = await setup();
    const input = screen.getByLabelText('Tenants');
    fireEvent.blur(input);
    expect(onChange).not.toHaveBeenCalled();
    fireEvent.change(input, { target: { value: 'team-a, team-b' } });
    fireEvent.blur(input);
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ tenants: ['team-a', 'team-b'] }));
    expect(onRunQuery).toHaveBeenCalledTimes(1);
  });

  it('commits the label selector on blur only when it changed', async () => {
    const { onChange, onRunQuery } = await setup();
    const input = screen.getByLabelText('Label selector');
    fireEvent.blur(input);
    expect(onChange).not.toHaveBeenCalled();
    fireEvent.change(input, { target: { value: '{service_name="api"}' } });
    expect(onChange).not.toHaveBeenCalled();
    fireEvent.blur(input);
    expect(onChange).toHaveBeenCalledWith(expect.objectContaining({ labelSelector: '{service_name="api"}' }));
    expect(onRunQuery).toHaveBeenCalledTimes(1);
  });

  it('inserts name="value" from the label and value pickers', async () => {
    const { ds, onChange, onRunQuery } = await setup(baseQuery({ labelSelector: '{region="eu"}' }));
    await openSelect(screen.getByLabelText('Label'));
    fireEvent.click(await screen.findByText('service_name'));
    await waitFor(() => expect(ds.getLabelValues).toHaveBeenCalledWith('service_name', '{region="eu"}', range));

    await openSelect(screen.getByLabelText('Value'));
    fireEvent.click(await screen.findByText('web'));
    expect(onChange).toHaveBeenCalledWith(
      expect.objectContaining({ labelSelector: '{region="eu", service_name="web"}' })
    );
    expect(onRunQuery).toHaveBeenCalled();
  });

  it('offers label names for group-by', async () => {
    const { onChange } = await setup();
    await openSelect(screen.getByLabelText('Group by'));
    fireEvent.click(await screen.findByText('region'));
    expect(onChange).toHaveBeenCalledWith(expect.objectContaining({ groupBy: ['region'] }));
  });

  it('fills in defaults for a query saved without them', async () => {
    const { onChange } = await setup({ refId: 'B' } as KilnQuery);
    expect(screen.getByLabelText('Label selector')).toHaveValue('{}');
    fireEvent.click(screen.getByRole('radio', { name: 'Both' }));
    fireEvent.click(screen.getByRole('radio', { name: 'Metrics' }));
    expect(onChange).toHaveBeenLastCalledWith(
      expect.objectContaining({ refId: 'B', queryType: 'metrics', labelSelector: '{}', groupBy: [], profileTypeId: '' })
    );
  });

  it('shows an error when the backend cannot list profile types', async () => {
    const ds = fakeDatasource();
    ds.getProfileTypes.mockRejectedValue({ data: { message: 'kiln unreachable' } });
    render(
      <QueryEditor
        datasource={ds as unknown as DataSource}
        query={baseQuery()}
        onChange={jest.fn()}
        onRunQuery={jest.fn()}
        range={range}
      />
    );
    expect(await screen.findByRole('alert')).toHaveTextContent('Could not load profile types: kiln unreachable');
  });
});
