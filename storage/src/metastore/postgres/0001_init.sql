-- Kiln metastore schema, version 1. One row per entry (one tenant's dataset of one object in one
-- partition), with the columns lookups filter on and the protobuf entry itself.
CREATE TABLE kiln_blocks (
    tenant        TEXT     NOT NULL,
    partition     BIGINT   NOT NULL,
    id            TEXT     NOT NULL,
    shard         BIGINT   NOT NULL,
    level         INTEGER  NOT NULL,
    min_time      BIGINT   NOT NULL,
    max_time      BIGINT   NOT NULL,
    services      TEXT[]   NOT NULL,
    profile_types TEXT[]   NOT NULL,
    created_ms    BIGINT   NOT NULL,
    bytes         BIGINT   NOT NULL,
    rows          BIGINT   NOT NULL,
    stack_nodes   BIGINT   NOT NULL,
    -- The compaction job that claimed the entry; NULL while it waits in the queue.
    job_id        BIGINT,
    entry         BYTEA    NOT NULL,
    PRIMARY KEY (tenant, partition, id)
);
CREATE INDEX kiln_blocks_by_id ON kiln_blocks (tenant, id);
CREATE INDEX kiln_blocks_queue ON kiln_blocks (tenant, partition, shard, level) WHERE job_id IS NULL;
CREATE INDEX kiln_blocks_claims ON kiln_blocks (job_id) WHERE job_id IS NOT NULL;

-- What a tenant holds per partition; lookups prune partitions by their data time range.
CREATE TABLE kiln_partitions (
    tenant    TEXT   NOT NULL,
    partition BIGINT NOT NULL,
    blocks    BIGINT NOT NULL,
    bytes     BIGINT NOT NULL,
    rows      BIGINT NOT NULL,
    min_time  BIGINT NOT NULL,
    max_time  BIGINT NOT NULL,
    PRIMARY KEY (tenant, partition)
);

-- Objects and how many entries name them (an L0 segment holds every tenant of a flush).
CREATE TABLE kiln_objects (
    id   TEXT    PRIMARY KEY,
    path TEXT    NOT NULL,
    refs INTEGER NOT NULL
);

-- Objects that lost their last entry, deleted once due.
CREATE TABLE kiln_object_tombstones (
    id     TEXT   PRIMARY KEY,
    path   TEXT   NOT NULL,
    due_ms BIGINT NOT NULL
);
CREATE INDEX kiln_object_tombstones_due ON kiln_object_tombstones (due_ms);

-- Entries compacted away: never to be added again.
CREATE TABLE kiln_entry_tombstones (
    id        TEXT   NOT NULL,
    tenant    TEXT   NOT NULL,
    partition BIGINT NOT NULL,
    PRIMARY KEY (id, tenant, partition)
);

CREATE TABLE kiln_jobs (
    id               BIGSERIAL PRIMARY KEY,
    tenant           TEXT    NOT NULL,
    partition        BIGINT  NOT NULL,
    shard            BIGINT  NOT NULL,
    level            INTEGER NOT NULL,
    -- JSON list of the sources' queue summaries.
    sources          BYTEA   NOT NULL,
    owner            TEXT    NOT NULL DEFAULT '',
    lease_expires_ms BIGINT  NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX kiln_jobs_by_tenant ON kiln_jobs (tenant, partition);

CREATE TABLE kiln_quarantine (
    tenant    TEXT   NOT NULL,
    id        TEXT   NOT NULL,
    partition BIGINT NOT NULL,
    path      TEXT   NOT NULL,
    reason    TEXT   NOT NULL,
    at_ms     BIGINT NOT NULL,
    PRIMARY KEY (tenant, id, partition)
);
