// Browser entry of the flame graph render test: renders window.__KILN_FRAME__ (the JSON frame given
// to run.mjs) with @grafana/flamegraph's <FlameGraph> and records what the component draws.
import React from 'react';
import { createRoot } from 'react-dom/client';
import { createDataFrame, createTheme, FieldType } from '@grafana/data';
import { FlameGraph, checkFields, getMessageCheckFieldsResult } from '@grafana/flamegraph';

const state = { drawn: [], rects: 0, errors: [], checkError: null, rendered: false };
window.__KILN_RESULT__ = state;

// Record every label the flame graph draws on its canvas (rendering.js → ctx.fillText).
const proto = CanvasRenderingContext2D.prototype;
const origFillText = proto.fillText;
proto.fillText = function (text, ...rest) {
  state.drawn.push(String(text));
  return origFillText.call(this, text, ...rest);
};
for (const m of ['fillRect', 'fill']) {
  const orig = proto[m];
  proto[m] = function (...args) {
    state.rects += 1;
    return orig.apply(this, args);
  };
}
window.addEventListener('error', (e) => state.errors.push(String(e.message || e)));
window.addEventListener('unhandledrejection', (e) => state.errors.push(String(e.reason)));

function inferType(f) {
  if (f.type) {
    return f.type;
  }
  return f.values.every((v) => typeof v === 'number') ? FieldType.number : FieldType.string;
}

function toFrame(input) {
  return createDataFrame({
    name: input.name ?? 'response',
    meta: { preferredVisualisationType: 'flamegraph' },
    fields: input.fields.map((f) => ({
      name: f.name,
      type: inferType(f),
      values: f.values,
      config: { ...(f.config ?? {}), ...(f.unit ? { unit: f.unit } : {}) },
    })),
  });
}

try {
  const frame = toFrame(window.__KILN_FRAME__);
  const check = checkFields(frame);
  if (check) {
    state.checkError = getMessageCheckFieldsResult(check);
  }
  const theme = createTheme({ colors: { mode: 'light' } });
  const root = createRoot(document.getElementById('root'));
  root.render(
    <div style={{ width: '1400px', height: '900px' }}>
      <FlameGraph data={frame} getTheme={() => theme} />
    </div>
  );
  state.rendered = true;
} catch (e) {
  state.errors.push(String((e && e.stack) || e));
}
