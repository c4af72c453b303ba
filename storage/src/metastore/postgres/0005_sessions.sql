-- Kiln metastore schema, version 5: sessions that calls reaching different processes share
-- (ADR 0019): a debug-file upload's, begun on one process and finished on another. A small
-- document per (tenant, key), gone once it expires.
CREATE TABLE kiln_sessions (
    tenant  TEXT        NOT NULL,
    key     TEXT        NOT NULL,
    value   BYTEA       NOT NULL,
    expires TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant, key)
);
