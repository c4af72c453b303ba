/**
 * Loads the built dist/module.js the way Grafana does (an AMD `define` whose dependencies Grafana
 * provides) and checks that it exports a working datasource plugin. Run by `npm run test:dist`
 * after `npm run build` (build.sh does both).
 */
import fs from 'fs';
import path from 'path';
import vm from 'vm';

const DIST = path.resolve(__dirname, '..', 'dist');
const ALLOWED_EXTERNALS = new Set(['@grafana/data', '@grafana/runtime', '@grafana/ui', 'react', 'react-dom', 'react/jsx-runtime', '@emotion/css', 'rxjs', 'lodash']);

describe('dist/module.js', () => {
  const file = path.join(DIST, 'module.js');

  it('exists (run `npm run build` first)', () => {
    expect(fs.existsSync(file)).toBe(true);
  });

  it('is an AMD module with only Grafana-provided externals, exporting the plugin', () => {
    const code = fs.readFileSync(file, 'utf8');
    let deps: string[] = [];
    let factory: ((...mods: unknown[]) => unknown) | undefined;
    const define = (d: string[], f: (...mods: unknown[]) => unknown) => {
      deps = d;
      factory = f;
    };
    vm.runInNewContext(code, { define, console }, { filename: file });
    expect(factory).toBeDefined();
    expect(deps).toEqual(expect.arrayContaining(['@grafana/data', '@grafana/runtime', '@grafana/ui', 'react']));
    for (const d of deps) {
      expect(ALLOWED_EXTERNALS.has(d)).toBe(true);
    }
    // Hand the factory the real modules, as Grafana's SystemJS loader would.
    const mods = deps.map((d) => require(d));
    const exported = factory!(...mods) as { plugin: any };
    expect(exported.plugin).toBeDefined();
    expect(typeof exported.plugin.components.QueryEditor).toBe('function');
    expect(typeof exported.plugin.components.ConfigEditor).toBe('function');
    const ds = new exported.plugin.DataSourceClass({
      id: 1,
      uid: 'u',
      type: 'kiln-profiles-datasource',
      name: 'Kiln',
      jsonData: {},
      meta: {},
    });
    expect(ds.getDefaultQuery()).toEqual({ queryType: 'both', labelSelector: '{}', groupBy: [] });
    expect(ds.filterQuery({ refId: 'A', profileTypeId: '' })).toBe(false);
    expect(ds.filterQuery({ refId: 'A', profileTypeId: 'process_cpu:cpu:nanoseconds:cpu:nanoseconds' })).toBe(true);
  });

  it('ships plugin.json with the version filled in, the logo and the README', () => {
    const meta = JSON.parse(fs.readFileSync(path.join(DIST, 'plugin.json'), 'utf8'));
    const pkg = JSON.parse(fs.readFileSync(path.resolve(__dirname, '..', 'package.json'), 'utf8'));
    expect(meta.id).toBe('kiln-profiles-datasource');
    expect(meta.info.version).toBe(pkg.version);
    expect(meta.info.updated).toMatch(/^\d{4}-\d{2}-\d{2}$/);
    expect(fs.existsSync(path.join(DIST, meta.info.logos.small))).toBe(true);
    expect(fs.readFileSync(path.join(DIST, 'README.md'), 'utf8')).not.toContain('%VERSION%');
  });
});
