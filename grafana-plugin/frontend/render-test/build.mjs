// Bundles entry.jsx with esbuild into one IIFE script for the browser.
import * as esbuild from 'esbuild';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

export async function bundle(outfile = path.join(here, 'build', 'bundle.js')) {
  await esbuild.build({
    entryPoints: [path.join(here, 'entry.jsx')],
    outfile,
    bundle: true,
    format: 'iife',
    platform: 'browser',
    target: 'es2020',
    jsx: 'automatic',
    minify: false,
    sourcemap: false,
    logLevel: 'warning',
    define: { 'process.env.NODE_ENV': '"production"', global: 'window' },
    loader: {
      '.css': 'empty',
      '.scss': 'empty',
      '.woff': 'empty',
      '.woff2': 'empty',
      '.ttf': 'empty',
      '.eot': 'empty',
      '.svg': 'dataurl',
      '.png': 'dataurl',
    },
    absWorkingDir: here,
  });
  return outfile;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const out = await bundle();
  console.log(`bundled ${out}`);
}
