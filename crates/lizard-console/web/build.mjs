// Bundles the console into one directory of static files: app.js (src/main.ts,
// minified), app.css and index.html.
// `node build.mjs OUT_DIR`; run by build.rs after `npm ci`.
import { build } from 'esbuild'
import { copyFileSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'

const out = process.argv[2]
if (!out) throw new Error('usage: node build.mjs OUT_DIR')
mkdirSync(out, { recursive: true })
await build({
  entryPoints: ['src/main.ts'],
  bundle: true,
  minify: true,
  format: 'esm',
  target: 'es2020',
  outfile: join(out, 'app.js'),
  legalComments: 'none',
  logLevel: 'warning',
})
copyFileSync('static/console.css', join(out, 'app.css'))
copyFileSync('static/index.html', join(out, 'index.html'))
