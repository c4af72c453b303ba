import { DataSourcePlugin } from '@grafana/data';

import { ConfigEditor } from './components/ConfigEditor';
import { QueryEditor } from './components/QueryEditor';
import { DataSource } from './datasource';
import { KilnOptions, KilnQuery, KilnSecureJsonData } from './types';

export const plugin = new DataSourcePlugin<DataSource, KilnQuery, KilnOptions, KilnSecureJsonData>(DataSource)
  .setConfigEditor(ConfigEditor)
  .setQueryEditor(QueryEditor);
