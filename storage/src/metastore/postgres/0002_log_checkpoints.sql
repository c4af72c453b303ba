-- Kiln metastore schema, version 2: where each write-ahead log stands (ADR 0018). A row per
-- log (an ingesting process's log id and shard): every record up to `seq` is in registered
-- blocks, recorded in the transaction that registers them.
CREATE TABLE kiln_log_checkpoints (
    log TEXT   PRIMARY KEY,
    seq BIGINT NOT NULL
);
