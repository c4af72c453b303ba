import pluginJson from './plugin.json';
import { plugin } from './module';
import { DataSource } from './datasource';
import { ConfigEditor } from './components/ConfigEditor';
import { QueryEditor } from './components/QueryEditor';

describe('module', () => {
  it('exports a datasource plugin wired to the Kiln editors', () => {
    expect(plugin.DataSourceClass).toBe(DataSource);
    expect(plugin.components.ConfigEditor).toBe(ConfigEditor);
    expect(plugin.components.QueryEditor).toBe(QueryEditor);
  });

  it('has the plugin.json Grafana needs for a backend profiling datasource', () => {
    expect(pluginJson).toMatchObject({
      type: 'datasource',
      id: 'kiln-profiles-datasource',
      name: 'Kiln',
      backend: true,
      executable: 'gpx_kiln',
      metrics: true,
      alerting: false,
      category: 'profiling',
      info: { logos: { small: 'img/logo.svg', large: 'img/logo.svg' }, version: '%VERSION%' },
    });
  });
});
