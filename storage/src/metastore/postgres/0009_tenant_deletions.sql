-- Kiln metastore schema, version 9: when each tenant was last deleted. An entry registered
-- later that holds only writes received before then is refused (a spooled or logged write,
-- or another process's buffer, does not bring the tenant back).
CREATE TABLE kiln_tenant_deletions (
    tenant     TEXT   PRIMARY KEY,
    deleted_ms BIGINT NOT NULL
);
