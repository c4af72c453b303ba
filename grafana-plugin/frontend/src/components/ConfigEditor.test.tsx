import React from 'react';
import { fireEvent, render, screen } from '@testing-library/react';
import { DataSourceSettings } from '@grafana/data';

import { KilnOptions, KilnSecureJsonData } from '../types';
import { ConfigEditor } from './ConfigEditor';

function settings(partial: Partial<DataSourceSettings<KilnOptions, KilnSecureJsonData>> = {}) {
  return {
    id: 1,
    uid: 'u',
    orgId: 1,
    name: 'Kiln',
    type: 'kiln-profiles-datasource',
    typeName: 'Kiln',
    typeLogoUrl: '',
    access: 'proxy',
    url: '',
    user: '',
    database: '',
    basicAuth: false,
    basicAuthUser: '',
    isDefault: false,
    withCredentials: false,
    readOnly: false,
    jsonData: { url: 'http://kiln:4040', tenant: 'acme' },
    secureJsonFields: {},
    secureJsonData: {},
    version: 1,
    ...partial,
  } as DataSourceSettings<KilnOptions, KilnSecureJsonData>;
}

describe('ConfigEditor', () => {
  it('edits URL and tenant in jsonData', () => {
    const onOptionsChange = jest.fn();
    render(<ConfigEditor options={settings()} onOptionsChange={onOptionsChange} />);
    expect(screen.getByLabelText('Kiln URL')).toHaveValue('http://kiln:4040');
    fireEvent.change(screen.getByLabelText('Kiln URL'), { target: { value: 'https://kiln.example:4040' } });
    expect(onOptionsChange).toHaveBeenLastCalledWith(
      expect.objectContaining({ jsonData: { url: 'https://kiln.example:4040', tenant: 'acme' } })
    );
    fireEvent.change(screen.getByLabelText('Tenant'), { target: { value: 'other' } });
    expect(onOptionsChange).toHaveBeenLastCalledWith(
      expect.objectContaining({ jsonData: { url: 'http://kiln:4040', tenant: 'other' } })
    );
  });

  it('toggles TLS skip-verify', () => {
    const onOptionsChange = jest.fn();
    render(<ConfigEditor options={settings()} onOptionsChange={onOptionsChange} />);
    fireEvent.click(screen.getByLabelText('Skip TLS verify'));
    expect(onOptionsChange).toHaveBeenLastCalledWith(
      expect.objectContaining({ jsonData: expect.objectContaining({ tlsSkipVerify: true }) })
    );
  });

  it('writes the token to secureJsonData', () => {
    const onOptionsChange = jest.fn();
    render(<ConfigEditor options={settings()} onOptionsChange={onOptionsChange} />);
    fireEvent.change(screen.getByLabelText('Token'), { target: { value: 's3cret' } });
    expect(onOptionsChange).toHaveBeenLastCalledWith(expect.objectContaining({ secureJsonData: { token: 's3cret' } }));
  });

  it('resets a configured token', () => {
    const onOptionsChange = jest.fn();
    render(
      <ConfigEditor options={settings({ secureJsonFields: { token: true } })} onOptionsChange={onOptionsChange} />
    );
    expect(screen.getByDisplayValue('configured')).toBeInTheDocument();
    fireEvent.click(screen.getByRole('button', { name: 'Reset' }));
    expect(onOptionsChange).toHaveBeenLastCalledWith(
      expect.objectContaining({ secureJsonFields: { token: false }, secureJsonData: { token: '' } })
    );
  });
});
