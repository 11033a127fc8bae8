// Gzipped size of what the initial page load fetches: index.html, the entry JS and CSS,
// and everything they import statically (the modulepreloads), from dist/ after `npm run build`.
// Lazy route chunks are not counted. The last line is JSON: {"initial_gzip_kb": N}.
import { readFileSync, existsSync } from 'node:fs'
import { gzipSync } from 'node:zlib'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const dist = join(dirname(fileURLToPath(import.meta.url)), '..', 'dist')
const manifestPath = join(dist, '.vite', 'manifest.json')
if (!existsSync(manifestPath)) {
  console.error('dist/.vite/manifest.json is missing: run `npm run build` first')
  process.exit(1)
}
const manifest = JSON.parse(readFileSync(manifestPath, 'utf8'))
const entryKey = Object.keys(manifest).find((key) => manifest[key].isEntry)

const files = new Set(['index.html'])
const seen = new Set()
function visit(key) {
  if (seen.has(key)) return
  seen.add(key)
  const chunk = manifest[key]
  files.add(chunk.file)
  for (const css of chunk.css || []) files.add(css)
  for (const imported of chunk.imports || []) visit(imported)
}
visit(entryKey)

let total = 0
const rows = []
for (const file of files) {
  const gzipped = gzipSync(readFileSync(join(dist, file)), { level: 9 }).length
  total += gzipped
  rows.push([file, gzipped])
}
rows.sort((a, b) => b[1] - a[1])
for (const [file, bytes] of rows) console.log(`${(bytes / 1024).toFixed(1).padStart(8)} KB  ${file}`)
console.log(JSON.stringify({ initial_gzip_kb: Math.round((total / 1024) * 10) / 10 }))
