// Calls Kiln's querier.v1 over gRPC-Web with connect-es (the gRPC-Web transport of
// @connectrpc/connect-node), its service and messages read at run time from Kiln's descriptor set.
// Usage: node grpcweb.mjs BASE_URL DESCRIPTOR_SET HEADERS_JSON CALLS_JSON
// CALLS_JSON: [{"method": "ProfileTypes", "request": {...proto JSON...}}, ...]. Prints one JSON
// array: per call {method, ok, response} or {method, ok: false, code, message}.
import { readFileSync } from 'node:fs';
import { ConnectError, Code, createClient } from '@connectrpc/connect';
import { createGrpcWebTransport } from '@connectrpc/connect-node';
import { createFileRegistry, fromBinary, fromJson, toJson } from '@bufbuild/protobuf';
import { FileDescriptorSetSchema } from '@bufbuild/protobuf/wkt';

const [baseUrl, descriptorPath, headersJson, callsJson] = process.argv.slice(2);
const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, readFileSync(descriptorPath)));
const service = registry.getService('querier.v1.QuerierService');
const client = createClient(service, createGrpcWebTransport({ baseUrl, httpVersion: '1.1' }));
const headers = JSON.parse(headersJson);

const out = [];
for (const { method, request } of JSON.parse(callsJson)) {
  const desc = service.methods.find((m) => m.name === method);
  try {
    const input = fromJson(desc.input, request, { registry });
    const response = await client[desc.localName](input, { headers });
    out.push({ method, ok: true, response: toJson(desc.output, response, { registry }) });
  } catch (e) {
    const err = ConnectError.from(e);
    out.push({ method, ok: false, code: Code[err.code], message: err.rawMessage });
  }
}
console.log(JSON.stringify(out));
