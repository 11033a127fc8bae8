// Browser side of bench/dashboard.py: cold-cache loads of the dashboard on a real node.
//   DEFL_URL=http://127.0.0.1:8000 DEFL_USER=... DEFL_PASSWORD=... [DEFL_RUNS=5] node e2e/bench-dashboard.mjs
// Each run is a fresh browser context (empty cache): sign in through the API (token in storage),
// load the overview and read its Largest Contentful Paint and the JavaScript transferred; the
// job page is a deep link to a job whose API answers are mocked (fixtures/federation.js), so
// its chart (and the charting library) loads as on a job with finished rounds. The same loads
// with `Accept-Encoding: identity` give the uncompressed side. Last line: one JSON object.
import { chromium } from 'playwright-core'
import { CHROMIUM, requireEnv } from './browser.mjs'
import { job, roundsOverTime } from './fixtures/federation.js'

const baseUrl = requireEnv('DEFL_URL')
const user = requireEnv('DEFL_USER')
const password = requireEnv('DEFL_PASSWORD')
const runs = Number(process.env.DEFL_RUNS || 5)
const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync']

const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ARGS })

async function freshContext({ identity = false } = {}) {
  const context = await browser.newContext({ viewport: { width: 1366, height: 860 }, reducedMotion: 'reduce' })
  if (identity) await context.setExtraHTTPHeaders({ 'Accept-Encoding': 'identity' })
  // Signed in as the dashboard would be: the token in this origin's storage before any script runs.
  const login = await context.request.post(`${baseUrl}/api/auth/login`, { data: { username: user, password } })
  if (!login.ok()) throw new Error(`sign-in failed: HTTP ${login.status()}`)
  const saved = JSON.stringify(await login.json())
  await context.addInitScript((value) => localStorage.setItem('defl.session', value), saved)
  return context
}

// Bytes of JavaScript that crossed the wire (headers + encoded body), as DevTools counts "transferred".
function countScripts(page) {
  const pending = []
  page.on('requestfinished', (request) => {
    if (request.resourceType() !== 'script') return
    pending.push(request.sizes().then((sizes) => sizes.responseBodySize + sizes.responseHeadersSize))
  })
  return async () => (await Promise.all(pending)).reduce((sum, bytes) => sum + bytes, 0)
}

async function loadOverview(options) {
  const context = await freshContext(options)
  const page = await context.newPage()
  const scripts = countScripts(page)
  await page.goto(`${baseUrl}/`, { waitUntil: 'load' })
  await page.locator('[data-test=overview-page]').waitFor({ timeout: 30000 })
  await page.waitForFunction(() => !document.querySelector('[data-test=loading]'), null, { timeout: 30000 })
  await page.waitForLoadState('networkidle')
  const lcp = await page.evaluate(
    () =>
      new Promise((resolve) => {
        new PerformanceObserver((list) => {
          const entries = list.getEntries()
          resolve(entries[entries.length - 1].startTime)
        }).observe({ type: 'largest-contentful-paint', buffered: true })
        setTimeout(() => resolve(null), 3000)
      }),
  )
  const bytes = await scripts()
  await context.close()
  return { lcp, bytes }
}

async function loadJobPage(options) {
  const context = await freshContext(options)
  const page = await context.newPage()
  const answers = { '/api/jobs/7': job, '/api/jobs/7/rounds': roundsOverTime[1], '/api/datasets': [], '/api/dashboard/join-candidates': { address: null, members: [] } }
  await page.route('**/api/**', (route) => {
    const path = new URL(route.request().url()).pathname
    if (path in answers) return route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(answers[path]) })
    return route.continue()
  })
  const scripts = countScripts(page)
  await page.goto(`${baseUrl}/jobs/7`, { waitUntil: 'load' })
  await page.locator('[data-test=metrics-chart] canvas').first().waitFor({ timeout: 30000 })
  await page.waitForLoadState('networkidle')
  const bytes = await scripts()
  await context.close()
  return bytes
}

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = Math.floor(sorted.length / 2)
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
}
const kb = (bytes) => Math.round((bytes / 1024) * 10) / 10

try {
  const overview = []
  for (let run = 0; run < runs; run += 1) {
    overview.push(await loadOverview())
    console.error(`overview run ${run + 1}: LCP ${overview[run].lcp?.toFixed(0)} ms, JS ${kb(overview[run].bytes)} KB`)
  }
  const rawOverview = await loadOverview({ identity: true })
  const jobBytes = await loadJobPage()
  const rawJobBytes = await loadJobPage({ identity: true })
  console.error(`uncompressed: overview JS ${kb(rawOverview.bytes)} KB, job page JS ${kb(rawJobBytes)} KB`)
  console.log(
    JSON.stringify({
      overview_lcp_ms: Math.round(median(overview.map((run) => run.lcp).filter((value) => value != null))),
      overview_lcp_ms_runs: overview.map((run) => Math.round(run.lcp ?? -1)),
      initial_js_kb_transferred: kb(median(overview.map((run) => run.bytes))),
      initial_js_kb_uncompressed: kb(rawOverview.bytes),
      job_page_js_kb_transferred: kb(jobBytes),
      job_page_js_kb_uncompressed: kb(rawJobBytes),
    }),
  )
} finally {
  await browser.close()
}
