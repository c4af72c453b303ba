import React, { ChangeEvent, KeyboardEvent, useEffect, useMemo, useState } from 'react';
import { QueryEditorProps, SelectableValue } from '@grafana/data';
import {
  InlineField,
  InlineFieldRow,
  Input,
  MultiSelect,
  RadioButtonGroup,
  Select,
} from '@grafana/ui';

import { DataSource } from '../datasource';
import { addMatcher } from '../selector';
import { DEFAULT_QUERY, KilnOptions, KilnQuery, KilnQueryType, ProfileType } from '../types';

export type KilnQueryEditorProps = QueryEditorProps<DataSource, KilnQuery, KilnOptions>;

export const QUERY_TYPE_OPTIONS: Array<SelectableValue<KilnQueryType>> = [
  { label: 'Profile', value: 'profile', description: 'Flame graph of the merged profile' },
  { label: 'Metrics', value: 'metrics', description: 'Time series of the profile values' },
  { label: 'Both', value: 'both', description: 'Flame graph and time series' },
];

/** Label shown for a profile type in the picker: `name - sampleType`. */
export function profileTypeLabel(pt: ProfileType): string {
  return `${pt.name} - ${pt.sampleType}`;
}

function withDefaults(query: KilnQuery): KilnQuery {
  return {
    ...query,
    queryType: query.queryType ?? (DEFAULT_QUERY.queryType as KilnQueryType),
    labelSelector: query.labelSelector ?? (DEFAULT_QUERY.labelSelector as string),
    groupBy: query.groupBy ?? [],
    profileTypeId: query.profileTypeId ?? '',
  };
}

function toOptions(values: string[]): Array<SelectableValue<string>> {
  return values.map((v) => ({ label: v, value: v }));
}

function errorText(e: unknown): string {
  if (e && typeof e === 'object') {
    const anyE = e as { message?: unknown; data?: { message?: unknown }; statusText?: unknown };
    if (typeof anyE.data?.message === 'string') {
      return anyE.data.message;
    }
    if (typeof anyE.message === 'string') {
      return anyE.message;
    }
    if (typeof anyE.statusText === 'string') {
      return anyE.statusText;
    }
  }
  return String(e);
}

export function QueryEditor(props: KilnQueryEditorProps) {
  const { datasource, onChange, onRunQuery, range } = props;
  const query = withDefaults(props.query);
  const from = range?.from.valueOf();
  const to = range?.to.valueOf();

  const [profileTypes, setProfileTypes] = useState<ProfileType[]>([]);
  const [profileTypesLoading, setProfileTypesLoading] = useState(false);
  const [labelNames, setLabelNames] = useState<string[]>([]);
  const [labelNamesLoading, setLabelNamesLoading] = useState(false);
  const [labelValues, setLabelValues] = useState<string[]>([]);
  const [labelValuesLoading, setLabelValuesLoading] = useState(false);
  const [selectedLabel, setSelectedLabel] = useState<string | undefined>(undefined);
  const [selector, setSelector] = useState(query.labelSelector);
  const [error, setError] = useState<string | undefined>(undefined);

  // Keep the local selector text in step with the saved query (e.g. after a completion or undo).
  useEffect(() => {
    setSelector(query.labelSelector);
  }, [query.labelSelector]);

  useEffect(() => {
    let cancelled = false;
    setProfileTypesLoading(true);
    datasource
      .getProfileTypes(range)
      .then((types) => {
        if (!cancelled) {
          setProfileTypes(types);
        }
      })
      .catch((e) => {
        if (!cancelled) {
          setError(`Could not load profile types: ${errorText(e)}`);
        }
      })
      .finally(() => {
        if (!cancelled) {
          setProfileTypesLoading(false);
        }
      });
    return () => {
      cancelled = true;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [datasource, from, to]);

  useEffect(() => {
    let cancelled = false;
    setLabelNamesLoading(true);
    datasource
      .getLabelNames(query.labelSelector, range)
      .then((names) => {
        if (!cancelled) {
          setLabelNames(names);
        }
      })
      .catch((e) => {
        if (!cancelled) {
          setError(`Could not load label names: ${errorText(e)}`);
        }
      })
      .finally(() => {
        if (!cancelled) {
          setLabelNamesLoading(false);
        }
      });
    return () => {
      cancelled = true;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [datasource, query.labelSelector, from, to]);

  useEffect(() => {
    if (!selectedLabel) {
      setLabelValues([]);
      return;
    }
    let cancelled = false;
    setLabelValuesLoading(true);
    datasource
      .getLabelValues(selectedLabel, query.labelSelector, range)
      .then((values) => {
        if (!cancelled) {
          setLabelValues(values);
        }
      })
      .catch((e) => {
        if (!cancelled) {
          setError(`Could not load values of ${selectedLabel}: ${errorText(e)}`);
        }
      })
      .finally(() => {
        if (!cancelled) {
          setLabelValuesLoading(false);
        }
      });
    return () => {
      cancelled = true;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [datasource, selectedLabel, query.labelSelector, from, to]);

  const profileTypeOptions = useMemo(() => {
    const opts: Array<SelectableValue<string>> = profileTypes.map((pt) => ({
      label: profileTypeLabel(pt),
      value: pt.id,
      description: pt.id,
    }));
    if (query.profileTypeId && !profileTypes.some((pt) => pt.id === query.profileTypeId)) {
      opts.push({ label: query.profileTypeId, value: query.profileTypeId });
    }
    return opts;
  }, [profileTypes, query.profileTypeId]);

  const change = (patch: Partial<KilnQuery>, run: boolean) => {
    onChange({ ...query, ...patch });
    if (run) {
      onRunQuery();
    }
  };

  const commitSelector = () => {
    const next = selector.trim() === '' ? '{}' : selector;
    if (next !== query.labelSelector) {
      change({ labelSelector: next }, true);
    }
  };

  // Tenants typed as `a|b` or `a, b`; committed on blur.
  const [tenants, setTenants] = useState((query.tenants ?? []).join('|'));
  const commitTenants = () => {
    const next = tenants.split(/[|,\s]+/).filter((t) => t !== '');
    if (next.join('|') !== (query.tenants ?? []).join('|')) {
      change({ tenants: next.length ? next : undefined }, true);
    }
  };

  const onMaxNodesChange = (e: ChangeEvent<HTMLInputElement>) => {
    const raw = e.target.value.trim();
    const n = raw === '' ? undefined : Number.parseInt(raw, 10);
    change({ maxNodes: n === undefined || Number.isNaN(n) || n <= 0 ? undefined : n }, false);
  };

  return (
    <div data-testid="kiln-query-editor">
      <InlineFieldRow>
        <InlineField label="Profile type" labelWidth={16} grow htmlFor="kiln-profile-type">
          <Select
            inputId="kiln-profile-type"
            aria-label="Profile type"
            placeholder="Select a profile type"
            isLoading={profileTypesLoading}
            options={profileTypeOptions}
            value={query.profileTypeId || null}
            allowCustomValue
            onChange={(v: SelectableValue<string>) => change({ profileTypeId: v?.value ?? '' }, true)}
          />
        </InlineField>
        <InlineField label="Query type" labelWidth={12}>
          <RadioButtonGroup<KilnQueryType>
            aria-label="Query type"
            options={QUERY_TYPE_OPTIONS}
            value={query.queryType}
            onChange={(v: KilnQueryType) => change({ queryType: v }, true)}
          />
        </InlineField>
      </InlineFieldRow>
      <InlineFieldRow>
        <InlineField
          label="Label selector"
          labelWidth={16}
          grow
          tooltip='PromQL-style selector, e.g. {service_name="api"}'
          htmlFor="kiln-label-selector"
        >
          <Input
            id="kiln-label-selector"
            aria-label="Label selector"
            value={selector}
            placeholder="{}"
            onChange={(e: ChangeEvent<HTMLInputElement>) => setSelector(e.target.value)}
            onBlur={commitSelector}
            onKeyDown={(e: KeyboardEvent<HTMLInputElement>) => {
              if (e.key === 'Enter') {
                commitSelector();
              }
            }}
          />
        </InlineField>
        <InlineField label="Label" labelWidth={8} htmlFor="kiln-label-name">
          <Select
            inputId="kiln-label-name"
            aria-label="Label"
            width={24}
            placeholder="name"
            isLoading={labelNamesLoading}
            options={toOptions(labelNames)}
            value={selectedLabel ?? null}
            isClearable
            onChange={(v: SelectableValue<string> | null) => setSelectedLabel(v?.value ?? undefined)}
          />
        </InlineField>
        <InlineField label="Value" labelWidth={8} htmlFor="kiln-label-value" disabled={!selectedLabel}>
          <Select
            inputId="kiln-label-value"
            aria-label="Value"
            width={32}
            placeholder={selectedLabel ? 'value' : 'choose a label first'}
            isLoading={labelValuesLoading}
            options={toOptions(labelValues)}
            value={null}
            disabled={!selectedLabel}
            onChange={(v: SelectableValue<string>) => {
              if (selectedLabel && v?.value !== undefined) {
                const next = addMatcher(query.labelSelector, selectedLabel, v.value);
                setSelectedLabel(undefined);
                change({ labelSelector: next }, true);
              }
            }}
          />
        </InlineField>
      </InlineFieldRow>
      <InlineFieldRow>
        <InlineField label="Group by" labelWidth={16} grow htmlFor="kiln-group-by">
          <MultiSelect<string>
            inputId="kiln-group-by"
            aria-label="Group by"
            placeholder="labels (metrics only)"
            isLoading={labelNamesLoading}
            options={toOptions(labelNames)}
            value={query.groupBy}
            allowCustomValue
            onChange={(vs: Array<SelectableValue<string>>) =>
              change({ groupBy: vs.map((v) => v.value).filter((v): v is string => !!v) }, true)
            }
          />
        </InlineField>
        <InlineField
          label="Tenants"
          labelWidth={10}
          tooltip="Tenants read as one, a|b (empty: the datasource's); group by __tenant__ to split them"
          htmlFor="kiln-tenants"
        >
          <Input
            id="kiln-tenants"
            aria-label="Tenants"
            width={20}
            placeholder="datasource's"
            value={tenants}
            onChange={(e: ChangeEvent<HTMLInputElement>) => setTenants(e.target.value)}
            onBlur={commitTenants}
          />
        </InlineField>
        <InlineField
          label="Max nodes"
          labelWidth={12}
          tooltip="Maximum number of flame graph nodes (empty: backend default)"
          htmlFor="kiln-max-nodes"
        >
          <Input
            id="kiln-max-nodes"
            aria-label="Max nodes"
            type="number"
            min={1}
            width={12}
            placeholder="default"
            value={query.maxNodes ?? ''}
            onChange={onMaxNodesChange}
            onBlur={() => onRunQuery()}
          />
        </InlineField>
      </InlineFieldRow>
      {error && (
        <div role="alert" data-testid="kiln-query-editor-error" style={{ color: 'red' }}>
          {error}
        </div>
      )}
    </div>
  );
}
