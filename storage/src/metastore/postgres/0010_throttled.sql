-- Kiln metastore schema, version 10: the minutes in which a tenant's writes were refused for
-- its ingest rate, for SelectSeries' throttling annotations. Each process adds its refusals
-- every 10 s; rows older than 31 days are deleted as new ones are added.
CREATE TABLE kiln_throttled (
    tenant    TEXT   NOT NULL,
    minute_ms BIGINT NOT NULL,
    refused   BIGINT NOT NULL,
    PRIMARY KEY (tenant, minute_ms)
);
