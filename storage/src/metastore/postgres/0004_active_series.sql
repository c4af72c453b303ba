-- Kiln metastore schema, version 4: each tenant's active series, counted for every process
-- (ADR 0019). A row per series hash, with when a process last saw it; a series is active while
-- one saw it within the window. Processes add series new to them under the tenant's advisory
-- lock, so the count of `max_series` is exact, and refresh the series they keep seeing.
CREATE TABLE kiln_active_series (
    tenant    TEXT        NOT NULL,
    hash      BIGINT      NOT NULL,
    last_seen TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, hash)
);
CREATE INDEX kiln_active_series_seen ON kiln_active_series (tenant, last_seen);
