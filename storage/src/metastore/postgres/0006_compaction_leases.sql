-- Kiln metastore schema, version 6: compaction any process can plan (ADR 0020).
-- When each entry came, on the database's clock: the planner judges a partition quiet from it,
-- so every planner, restarted or not, plans the same. Entries of older versions read 0, which
-- means "at their creation time".
ALTER TABLE kiln_blocks ADD COLUMN arrived_ms BIGINT NOT NULL DEFAULT 0;

-- Cluster-wide leases, one row each (planning, deletions, retention, gauges): the holder, the
-- epoch (one more each time the lease changes hands) and the expiry on the database's clock.
CREATE TABLE kiln_leases (
    name    TEXT        PRIMARY KEY,
    holder  TEXT        NOT NULL,
    epoch   BIGINT      NOT NULL,
    expires TIMESTAMPTZ NOT NULL
);
