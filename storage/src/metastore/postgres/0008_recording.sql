-- Kiln metastore schema, version 8: recording rules for the cluster (ADR 0021). A level-0
-- compaction job adds its rule sums in the transaction that completes it, so each sum is
-- counted once with its data. The holder of the `recording` lease seals them into each
-- tenant's counters and points to send, in one transaction fenced by the lease's epoch.
CREATE TABLE kiln_recording_sums (
    tenant      TEXT   NOT NULL,
    rule        TEXT   NOT NULL,
    -- The series' group labels, as the gateway encodes them (JSON).
    series      TEXT   NOT NULL,
    -- The interval's start, Unix milliseconds, on the grid of `--recording-interval`.
    interval_ms BIGINT NOT NULL,
    value       BIGINT NOT NULL,
    PRIMARY KEY (tenant, rule, series, interval_ms)
);

-- A tenant's counters and grid (the gateway's checkpoint, JSON).
CREATE TABLE kiln_recording_state (
    tenant TEXT  NOT NULL PRIMARY KEY,
    state  BYTEA NOT NULL
);

-- Sealed points not yet sent, in the order they were sealed.
CREATE TABLE kiln_recording_outbox (
    seq         BIGSERIAL PRIMARY KEY,
    tenant      TEXT   NOT NULL,
    destination TEXT   NOT NULL,
    -- The sample's labels (JSON pairs), its time (Unix ms) and value.
    labels      TEXT   NOT NULL,
    time_ms     BIGINT NOT NULL,
    value       BIGINT NOT NULL
);
