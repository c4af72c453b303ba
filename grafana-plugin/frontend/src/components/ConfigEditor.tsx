import React, { ChangeEvent } from 'react';
import { DataSourcePluginOptionsEditorProps } from '@grafana/data';
import { FieldSet, InlineField, InlineSwitch, Input, SecretInput } from '@grafana/ui';

import { KilnOptions, KilnSecureJsonData } from '../types';

export type ConfigEditorProps = DataSourcePluginOptionsEditorProps<KilnOptions, KilnSecureJsonData>;

const LABEL_WIDTH = 20;
const INPUT_WIDTH = 50;

export function ConfigEditor(props: ConfigEditorProps) {
  const { onOptionsChange, options } = props;
  const jsonData = options.jsonData ?? {};
  const secureJsonFields = options.secureJsonFields ?? {};
  const secureJsonData = options.secureJsonData ?? {};

  const setJsonData = (patch: Partial<KilnOptions>) => {
    onOptionsChange({ ...options, jsonData: { ...jsonData, ...patch } });
  };

  const onTokenChange = (event: ChangeEvent<HTMLInputElement>) => {
    onOptionsChange({
      ...options,
      secureJsonData: { ...secureJsonData, token: event.target.value },
    });
  };

  const onTokenReset = () => {
    onOptionsChange({
      ...options,
      secureJsonFields: { ...secureJsonFields, token: false },
      secureJsonData: { ...secureJsonData, token: '' },
    });
  };

  return (
    <>
      <FieldSet label="Connection">
        <InlineField
          label="Kiln URL"
          labelWidth={LABEL_WIDTH}
          tooltip="Base URL of the Kiln query API, e.g. http://kiln:4040"
          required
          htmlFor="kiln-config-url"
        >
          <Input
            id="kiln-config-url"
            aria-label="Kiln URL"
            width={INPUT_WIDTH}
            placeholder="http://localhost:4040"
            value={jsonData.url ?? ''}
            onChange={(e: ChangeEvent<HTMLInputElement>) => setJsonData({ url: e.target.value })}
          />
        </InlineField>
        <InlineField
          label="Skip TLS verify"
          labelWidth={LABEL_WIDTH}
          tooltip="Do not verify the server's TLS certificate (testing only)"
          htmlFor="kiln-config-tls-skip-verify"
        >
          <InlineSwitch
            id="kiln-config-tls-skip-verify"
            aria-label="Skip TLS verify"
            value={jsonData.tlsSkipVerify ?? false}
            onChange={(e: React.FormEvent<HTMLInputElement>) => setJsonData({ tlsSkipVerify: e.currentTarget.checked })}
          />
        </InlineField>
      </FieldSet>
      <FieldSet label="Authentication">
        <InlineField
          label="Token"
          labelWidth={LABEL_WIDTH}
          tooltip="Bearer token sent to Kiln (stored encrypted, only the backend sees it)"
          htmlFor="kiln-config-token"
        >
          <SecretInput
            id="kiln-config-token"
            aria-label="Token"
            width={INPUT_WIDTH}
            placeholder="Bearer token"
            isConfigured={Boolean(secureJsonFields.token)}
            value={secureJsonData.token ?? ''}
            onChange={onTokenChange}
            onReset={onTokenReset}
          />
        </InlineField>
        <InlineField
          label="Tenant"
          labelWidth={LABEL_WIDTH}
          tooltip="Optional tenant id sent with every request (multi-tenant Kiln); a|b reads several as one"
          htmlFor="kiln-config-tenant"
        >
          <Input
            id="kiln-config-tenant"
            aria-label="Tenant"
            width={INPUT_WIDTH}
            placeholder="optional"
            value={jsonData.tenant ?? ''}
            onChange={(e: ChangeEvent<HTMLInputElement>) => setJsonData({ tenant: e.target.value })}
          />
        </InlineField>
      </FieldSet>
    </>
  );
}
