-- Kiln metastore schema, version 3: the processes of a cluster (ADR 0019). A row per process,
-- keyed by its instance id: its roles and its last heartbeat on the database's clock. A
-- process not heard from within the timeout is dead; one that leaves marks its row.
CREATE TABLE kiln_members (
    id        TEXT        PRIMARY KEY,
    roles     TEXT        NOT NULL,
    started   TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat TIMESTAMPTZ NOT NULL DEFAULT now(),
    leaving   BOOLEAN     NOT NULL DEFAULT false
);
