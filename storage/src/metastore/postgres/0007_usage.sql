-- Kiln metastore schema, version 7: tenants' usage counters for the cluster (ADR 0019). Each
-- process adds what it counted since its last flush, so a counter is the sum over processes,
-- and a restart loses at most one flush interval of counts.
CREATE TABLE kiln_usage (
    tenant  TEXT   NOT NULL,
    counter TEXT   NOT NULL,
    value   BIGINT NOT NULL,
    PRIMARY KEY (tenant, counter)
);
