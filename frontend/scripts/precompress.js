// A Vite build plugin that writes a gzip and a brotli copy next to every compressible asset
// (file.js -> file.js.gz, file.js.br). WhiteNoise (backend/web) serves the copy the browser
// accepts, with Content-Encoding and Vary set, so nothing is compressed per request.
// Node's own zlib does both formats: no third-party package to pin or trust.
import { brotliCompressSync, constants, gzipSync } from 'node:zlib'
import { readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'

const COMPRESSIBLE = /\.(js|mjs|css|html|svg|json|map|txt|woff)$/
// Tiny files gain nothing from compression (the headers cost more than the saving).
const MIN_BYTES = 1024

function* files(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) yield* files(path)
    else yield path
  }
}

export function compressFile(path) {
  const raw = readFileSync(path)
  if (raw.length < MIN_BYTES) return null
  const gzip = gzipSync(raw, { level: 9 })
  const brotli = brotliCompressSync(raw, {
    params: { [constants.BROTLI_PARAM_QUALITY]: 11, [constants.BROTLI_PARAM_SIZE_HINT]: raw.length },
  })
  // A copy that is not smaller would only cost a lookup: WhiteNoise serves the raw file then.
  if (gzip.length < raw.length) writeFileSync(`${path}.gz`, gzip)
  if (brotli.length < raw.length) writeFileSync(`${path}.br`, brotli)
  return { raw: raw.length, gzip: gzip.length, brotli: brotli.length }
}

export function precompress() {
  let outDir = 'dist'
  return {
    name: 'defl-precompress',
    apply: 'build',
    configResolved(config) {
      outDir = resolve(config.root, config.build.outDir)
    },
    closeBundle() {
      for (const path of files(outDir)) if (COMPRESSIBLE.test(path)) compressFile(path)
    },
  }
}
