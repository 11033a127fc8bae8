// Keeps one node's dashboard open while the test (tests/browser/test_dashboard_faults.py)
// breaks things around it, and reports what the page's health banner says as it changes.
// The page is never reloaded: a marker set in the window at the start must still be there at
// the end (a reload would drop it), so recovery has to come from the page's own polling.
//
//   DEFL_URL=http://127.0.0.1:8000 DEFL_OPERATOR_USER=operator DEFL_OPERATOR_PASSWORD=pw \
//   DEFL_STOP_FILE=/tmp/stop node e2e/faults.mjs
//
// Prints one JSON line per event: {"event":"ready"}, {"event":"banner","text":...} at each
// change, and {"event":"done","marker":...} when DEFL_STOP_FILE appears (or DEFL_WATCH_S passed).
import { existsSync } from 'node:fs'
import { launch, requireEnv, signIn } from './browser.mjs'

const baseUrl = requireEnv('DEFL_URL')
const username = requireEnv('DEFL_OPERATOR_USER')
const password = requireEnv('DEFL_OPERATOR_PASSWORD')
const stopFile = process.env.DEFL_STOP_FILE || ''
const deadline = Date.now() + Number(process.env.DEFL_WATCH_S || 900) * 1000
const say = (event) => console.log(JSON.stringify({ ...event, t: Date.now() }))

const browser = await launch()
let exitCode = 0
try {
  const page = await browser.context.newPage()
  await signIn(page, baseUrl, username, password)
  await page.evaluate(() => {
    window.__deflNoReload = 'kept'
  })
  say({ event: 'ready', url: page.url() })
  let last = null
  while (Date.now() < deadline && !(stopFile && existsSync(stopFile))) {
    let text
    try {
      const banner = page.locator('[data-test=health-banner]')
      text = (await banner.count()) ? (await banner.innerText()).trim() : ''
    } catch (error) {
      text = `(unreadable: ${error.message})`
    }
    if (text !== last) {
      say({ event: 'banner', text })
      last = text
    }
    await page.waitForTimeout(500)
  }
  const marker = await page.evaluate(() => window.__deflNoReload || null)
  say({ event: 'done', marker, url: page.url() })
} catch (error) {
  say({ event: 'error', message: String(error?.stack || error) })
  exitCode = 1
} finally {
  await browser.close()
}
process.exit(exitCode)
