//! Kiln Grafana datasource plugin.
