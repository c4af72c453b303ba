import { DataSourceJsonData } from '@grafana/data';
import { DataQuery } from '@grafana/schema';

export type KilnQueryType = 'profile' | 'metrics' | 'both';

/**
 * One query as the frontend sends it to the backend (`/api/ds/query` → QueryData).
 * Field names follow the Grafana Pyroscope datasource's query model.
 */
export interface KilnQuery extends DataQuery {
  queryType: KilnQueryType;
  /** `<name>:<sample_type>:<sample_unit>:<period_type>:<period_unit>`, e.g. `process_cpu:cpu:nanoseconds:cpu:nanoseconds` */
  profileTypeId: string;
  /** PromQL-style selector, e.g. `{service_name="api"}` */
  labelSelector: string;
  groupBy: string[];
  maxNodes?: number;
  spanSelector?: string[];
  /** Tenants read as one (sent as `X-Scope-OrgID: a|b`); empty: the datasource's tenant. */
  tenants?: string[];
}

export const DEFAULT_QUERY: Partial<KilnQuery> = {
  queryType: 'both',
  labelSelector: '{}',
  groupBy: [],
};

/** Options saved in the datasource's jsonData (visible to the frontend). */
export interface KilnOptions extends DataSourceJsonData {
  url?: string;
  tlsSkipVerify?: boolean;
  tenant?: string;
}

/** Options saved encrypted; only the backend sees their values. */
export interface KilnSecureJsonData {
  token?: string;
}

/** One element of the backend's `profileTypes` resource answer. */
export interface ProfileType {
  id: string;
  name: string;
  sampleType: string;
  sampleUnit: string;
  periodType: string;
  periodUnit: string;
}
