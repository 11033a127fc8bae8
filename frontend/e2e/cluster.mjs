// The Cluster page against a real node (its workers, slots, queue and failures as seeded by
// tests/browser/test_cluster_page.py), then the job page's tasks panel against a mocked API
// (a running, a queued and a failed task): logs, cancel and priority for an operator, none of
// it offered to a viewer. Nothing may log a console error.
//
//   DEFL_URL=http://127.0.0.1:8000 DEFL_OPERATOR=op:pw DEFL_WORKER=w2@browser node e2e/cluster.mjs
//
// The last line printed is a JSON summary; the exit status is 0 only when every check passed.
import { PHONE, check, launch, requireEnv, screenshotter, settled, signIn, watchConsole } from './browser.mjs'
import { candidates, dataset, job, roundsOverTime } from './fixtures/federation.js'

const baseUrl = requireEnv('DEFL_URL')
const [username, ...rest] = requireEnv('DEFL_OPERATOR').split(':')
const password = rest.join(':')
const workerName = requireEnv('DEFL_WORKER')
const shots = screenshotter(process.env.DEFL_SCREENSHOTS || 'out/screenshots')
const failures = []
let current = 'start'

const now = Date.now()
const iso = (offsetS) => new Date(now + offsetS * 1000).toISOString()
const task = (id, round, state, extra = {}) => ({
  id, job_id: 7, round, kind: 'train', state, priority: 0, queue_position: null, attempts: 1, max_attempts: 3,
  next_retry_at: null, cancel_requested: false, worker: 'w1@gpu-box', device: 'cpu', amount: 1,
  created: iso(-60), started_at: iso(-30), finished_at: null, wait_s: 0.4, duration_s: null, error: '', log: '', ...extra,
})
let tasks = [
  task(3, 4, 'running', { log: '2026-12-01T05:00:00 attempt 1/3 on w1@gpu-box cpu\nINFO fl_node.train: epoch 1 done\n' }),
  task(2, 3, 'queued', { queue_position: 1, attempts: 1, next_retry_at: iso(30), worker: null, device: null, error: 'OSError: disk full' }),
  task(1, 2, 'succeeded', { finished_at: iso(-10), duration_s: 12.5, log: 'succeeded in 12.500 s\n' }),
]
let priority = 0
const posted = []
const mockedRole = { role: 'operator' }

const json = (route, body, status = 200) => route.fulfill({ status, contentType: 'application/json', body: JSON.stringify(body) })
const jobRoutes = {
  'POST /api/auth/login': () => ({ token: 'mocked', user: { username: 'ada', role: mockedRole.role } }),
  'GET /api/auth/me': () => ({ username: 'ada', role: mockedRole.role }),
  'GET /api/jobs/7': () => job,
  'GET /api/jobs/7/rounds': () => roundsOverTime[0],
  'GET /api/jobs/7/tasks': () => ({ job_id: 7, priority, tasks }),
  'POST /api/jobs/7/tasks/2/cancel': () => {
    posted.push('cancel 2')
    tasks = tasks.map((t) => (t.id === 2 ? { ...t, state: 'cancelled', queue_position: null, next_retry_at: null } : t))
    return tasks.find((t) => t.id === 2)
  },
  'POST /api/jobs/7/tasks/priority': () => {
    posted.push('priority')
    priority = 7
    return { job_id: 7, priority, updated_tasks: 1 }
  },
  'GET /api/node': () => ({ address: candidates.address, name: 'org-a', chain: { available: true } }),
  'GET /api/peers': () => [],
  'GET /api/dashboard/join-candidates': () => candidates,
  'GET /api/datasets': () => ({ count: 1, results: [dataset] }),
}

const browser = await launch()
try {
  // ---- the real node's Cluster page
  const page = await browser.context.newPage()
  const errors = watchConsole(page, () => current)
  current = 'sign in (real node)'
  await signIn(page, baseUrl, username, password)
  current = 'cluster page (real node)'
  await page.locator('[data-test=nav-cluster]').click()
  await page.waitForURL((url) => url.pathname === '/cluster', { timeout: 20000 })
  await settled(page, '[data-test=cluster-page]')
  const worker = page.locator(`[data-test="worker-${workerName}"]`)
  check(failures, (await worker.count()) === 1, `the worker ${workerName} is not listed`)
  const slotText = await page.locator(`[data-test="slot-${workerName}-cpu"]`).innerText()
  check(failures, slotText.includes('0 / 2 cores'), `the worker's CPU slot does not show 0 / 2 cores: ${slotText}`)
  const queued = await page.locator('[data-test=queued-table] tbody tr').allInnerTexts()
  // Job 41's task failed once and waits for its retry (first in the queue), job 42's is behind it.
  check(failures, queued.length === 2 && queued[0].startsWith('1') && queued[1].includes('42'), `the queue should hold jobs 41 and 42: ${queued}`)
  check(failures, /in \d+ min/.test(queued[0]), `job 41's retry time is not shown as to come: ${queued[0]}`)
  const failed = await page.locator('[data-test=failures-table] tbody tr').allInnerTexts()
  check(failures, failed.some((row) => row.includes('OSError: disk full')), `the failure is not listed: ${failed}`)
  check(failures, !(await page.locator('[data-test=error]').count()), 'the cluster page shows an error state')
  await shots.shot(page, 'cluster')
  await page.setViewportSize(PHONE)
  await page.waitForTimeout(300)
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  check(failures, overflow <= 1, `the cluster page is ${overflow} px wider than a phone`)
  await shots.shot(page, 'cluster-phone')
  failures.push(...errors)
  await page.evaluate(() => localStorage.clear())
  await page.close()

  // ---- the job page's tasks panel, API mocked
  for (const role of ['operator', 'viewer']) {
    mockedRole.role = role
    const mocked = await browser.context.newPage()
    const mockedErrors = watchConsole(mocked, () => current)
    await mocked.route('**/api/**', async (route) => {
      const request = route.request()
      const handler = jobRoutes[`${request.method()} ${new URL(request.url()).pathname}`]
      if (!handler) return json(route, { detail: 'not mocked' }, 404)
      return json(route, handler())
    })
    current = `tasks panel (${role}, mocked)`
    await mocked.goto(`${baseUrl}/login?redirect=/jobs/7`)
    await mocked.locator('input[data-test=username-input]').fill('ada')
    await mocked.locator('input[data-test=password-input]').fill('secret')
    await mocked.locator('[data-test=sign-in-submit]').click()
    await mocked.waitForURL((url) => url.pathname === '/jobs/7', { timeout: 20000 })
    await settled(mocked, '[data-test=tasks-panel]')
    const rows = mocked.locator('[data-test=tasks-table] .el-table__body-wrapper tbody tr.el-table__row')
    check(failures, (await rows.count()) === 3, `${role}: the panel should list 3 tasks`)
    const cancels = mocked.locator('[data-test^=cancel-task-]')
    if (role === 'viewer') {
      check(failures, (await cancels.count()) === 0, 'a viewer is offered Cancel')
      check(failures, (await mocked.locator('[data-test=priority-save]').count()) === 0, 'a viewer is offered the priority')
    } else {
      check(failures, (await cancels.count()) === 2, 'the operator should be offered Cancel on the running and the queued task')
      await rows.nth(0).locator('.el-table__expand-icon').click()
      await mocked.locator('[data-test=task-log]', { hasText: 'epoch 1 done' }).waitFor({ timeout: 5000 })
      await shots.shot(mocked, 'tasks-panel')
      await mocked.locator('[data-test=cancel-task-2]').click()
      await mocked.locator('.el-message', { hasText: 'Task cancelled' }).waitFor({ timeout: 5000 })
      await mocked.locator('[data-test=cancel-task-2]').waitFor({ state: 'detached', timeout: 10000 })
      await mocked.locator('[data-test=priority-input] input').fill('7')
      await mocked.locator('[data-test=priority-save]').click()
      await mocked.locator('.el-message', { hasText: 'Priority 7 set' }).waitFor({ timeout: 5000 })
      check(failures, posted.join(',') === 'cancel 2,priority', `the panel posted ${posted.join(',')}`)
    }
    failures.push(...mockedErrors)
    await mocked.evaluate(() => localStorage.clear())
    await mocked.close()
  }
} catch (error) {
  failures.push(`${current}: ${error.message.split('\n')[0]}`)
} finally {
  await browser.close()
}

for (const failure of failures) console.error(`FAIL ${failure}`)
console.log(JSON.stringify({ ok: failures.length === 0, failures, screenshots: shots.taken.length }))
process.exit(failures.length ? 1 : 0)
