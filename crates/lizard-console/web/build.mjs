// Bundles the console into one directory of static files: app.js (src/main.ts and
// xterm.js, minified), app.css (static/console.css and xterm's CSS) and index.html.
// `node build.mjs OUT_DIR`; run by build.rs after `npm ci`.
import { build } from 'esbuild'
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
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
const css = [
  readFileSync('node_modules/@xterm/xterm/css/xterm.css', 'utf8'),
  readFileSync('static/console.css', 'utf8'),
].join('\n')
writeFileSync(join(out, 'app.css'), css)
copyFileSync('static/index.html', join(out, 'index.html'))
