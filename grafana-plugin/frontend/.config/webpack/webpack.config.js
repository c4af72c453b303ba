// Webpack build of the Grafana plugin frontend, modelled on the config that @grafana/create-plugin
// scaffolds (.config/webpack/webpack.config.ts), written as plain CommonJS so that it runs on Node 20
// without ts-node. Output: dist/module.js as an AMD module whose Grafana/React imports are externals
// that Grafana provides at run time.
'use strict';

const fs = require('fs');
const path = require('path');
const CopyWebpackPlugin = require('copy-webpack-plugin');
const webpack = require('webpack');

const ROOT = path.resolve(__dirname, '..', '..');
const SOURCE_DIR = path.join(ROOT, 'src');
const DIST_DIR = path.join(ROOT, 'dist');

const readJson = (p) => JSON.parse(fs.readFileSync(p, 'utf8'));
const pluginJson = readJson(path.join(SOURCE_DIR, 'plugin.json'));
const packageJson = readJson(path.join(ROOT, 'package.json'));
const today = new Date().toISOString().substring(0, 10);

// Same list as @grafana/create-plugin's .config/bundler/externals.ts.
const externals = [
  'lodash',
  'jquery',
  'moment',
  'slate',
  'emotion',
  '@emotion/react',
  '@emotion/css',
  'prismjs',
  'slate-plain-serializer',
  '@grafana/slate-react',
  'react',
  'react/jsx-runtime',
  'react/jsx-dev-runtime',
  'react-dom',
  'react-redux',
  'redux',
  'rxjs',
  'i18next',
  'react-router',
  'd3',
  'angular',
  /^@grafana\/ui/i,
  /^@grafana\/runtime/i,
  /^@grafana\/data/i,
  // Legacy SDK imports with the "grafana/" prefix.
  ({ request }, callback) => {
    const prefix = 'grafana/';
    if (request && request.indexOf(prefix) === 0) {
      return callback(undefined, request.slice(prefix.length));
    }
    callback();
  },
];

const replaceTemplateVars = (content) =>
  content
    .toString()
    .replace(/%VERSION%/g, packageJson.version)
    .replace(/%TODAY%/g, today)
    .replace(/%PLUGIN_ID%/g, pluginJson.id);

const logoPaths = Array.from(new Set([pluginJson.info?.logos?.large, pluginJson.info?.logos?.small])).filter(Boolean);

module.exports = (env = {}) => {
  const production = Boolean(env.production);
  return {
    context: SOURCE_DIR,
    devtool: production ? 'source-map' : 'eval-source-map',
    entry: { module: './module.ts' },
    externals,
    mode: production ? 'production' : 'development',
    module: {
      rules: [
        {
          exclude: /node_modules/,
          test: /\.[tj]sx?$/,
          use: {
            loader: 'swc-loader',
            options: {
              jsc: {
                baseUrl: SOURCE_DIR,
                target: 'es2015',
                loose: false,
                parser: { syntax: 'typescript', tsx: true, decorators: false, dynamicImport: true },
                transform: { react: { runtime: 'classic' } },
              },
            },
          },
        },
        {
          test: /\.(png|jpe?g|gif|svg)$/,
          type: 'asset/resource',
          generator: { filename: production ? '[hash][ext]' : '[file]' },
        },
      ],
    },
    optimization: { minimize: production },
    output: {
      clean: { keep: /(.*?_(amd64|arm(64)?)(.exe)?|go_plugin_build_manifest)/ },
      filename: '[name].js',
      chunkFilename: production ? '[name].js?_cache=[contenthash]' : '[name].js',
      library: { type: 'amd' },
      path: DIST_DIR,
      publicPath: `public/plugins/${pluginJson.id}/`,
      uniqueName: pluginJson.id,
    },
    plugins: [
      new webpack.BannerPlugin({
        banner: `/* plugin: ${pluginJson.id}@${packageJson.version} */`,
        raw: true,
        entryOnly: true,
      }),
      new CopyWebpackPlugin({
        patterns: [
          { from: path.join(SOURCE_DIR, 'plugin.json'), to: '.', transform: replaceTemplateVars },
          { from: path.join(ROOT, 'README.md'), to: '.', transform: replaceTemplateVars },
          ...logoPaths.map((p) => ({ from: p, to: p })),
        ],
      }),
    ],
    resolve: {
      extensions: ['.js', '.jsx', '.ts', '.tsx'],
      modules: [SOURCE_DIR, 'node_modules'],
    },
    performance: { hints: false },
  };
};
