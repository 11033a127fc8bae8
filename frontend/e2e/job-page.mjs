// The job, dataset and models pages against a mocked API (fixtures/federation.js), so that
// the round timeline, the charts, the accepted/rejected audit trail, the participants' privacy,
// the budget's explanation, revoking with confirmation, live polling, model download and
// predict are checked in a real browser before a federation can run; pages are reached by
// clicking, then the job page again on a 390 px phone.
// The SPA itself comes from a real node:
//   DEFL_URL=http://127.0.0.1:8000 DEFL_SCREENSHOTS=out/screenshots node e2e/job-page.mjs
import { PHONE, check, launch, requireEnv, screenshotter, settled, watchConsole } from './browser.mjs'
import { candidates, dataset, grantedToMe, job, models, prediction, roundsOverTime } from './fixtures/federation.js'

const baseUrl = requireEnv('DEFL_URL')
const shots = screenshotter(process.env.DEFL_SCREENSHOTS || 'out/screenshots')
const failures = []
let current = 'start'
let roundsCalls = 0
let revoked = false

const json = (route, body, status = 200) => route.fulfill({ status, contentType: 'application/json', body: JSON.stringify(body) })
const routes = {
  'POST /api/auth/login': () => ({ token: 'mocked', user: { username: 'ada', role: 'operator' } }),
  'POST /api/auth/logout': () => ({}),
  'GET /api/auth/me': () => ({ username: 'ada', role: 'operator' }),
  'GET /api/jobs': () => [job],
  'GET /api/jobs/7': () => job,
  'GET /api/jobs/7/rounds': () => roundsOverTime[Math.min(roundsCalls++, roundsOverTime.length - 1)],
  'GET /api/jobs/7/tasks': () => ({ job_id: 7, priority: 0, tasks: [] }),
  'GET /api/datasets': () => ({ count: 1, results: [dataset] }),
  'GET /api/datasets/1': () => dataset,
  'GET /api/datasets/1/grants': () => [{ node: '0xb0b0000000000000000000000000000000000002', tx_hash: '0x' + 'ab'.repeat(32), revoked: revoked ? '2026-11-29T11:00:00Z' : null }],
  'DELETE /api/datasets/1/grants/0xb0b0000000000000000000000000000000000002': () => {
    revoked = true
    return { node: '0xb0b0000000000000000000000000000000000002', revoked: '2026-11-29T11:00:00Z' }
  },
  'GET /api/dashboard/join-candidates': () => candidates,
  'GET /api/jobs/limits': () => ({ max_upload_bytes: 128 * 1024 * 1024, max_epsilon_cap: 100, max_target_epsilon: 100, max_committee: 15, max_participants: 200 }),
  'GET /api/dashboard/granted-datasets': () => grantedToMe,
  'GET /api/dashboard/models': () => models,
  // the health banner's poll
  'GET /api/node': () => ({ address: candidates.address, name: 'org-a', chain: { available: true } }),
  'GET /api/peers': () => [{ address: '0xb0b0000000000000000000000000000000000002', name: 'org-b', endpoint: 'http://127.0.0.1:8102', healthy: true, last_seen: new Date().toISOString() }],
  'GET /api/models': () => ({ count: models.length, results: models }),
  'POST /api/models/3/predict': () => prediction,
}

const browser = await launch()
const page = await browser.context.newPage()
const errors = watchConsole(page, () => current)
await page.route('**/api/**', async (route) => {
  const request = route.request()
  const path = new URL(request.url()).pathname
  if (request.method() === 'GET' && path === '/api/models/3/download') {
    return route.fulfill({ status: 200, contentType: 'application/octet-stream', body: Buffer.from('\x02\x00\x00\x00\x00\x00\x00\x00{}') })
  }
  const handler = routes[`${request.method()} ${path}`]
  if (!handler) return json(route, { detail: `not mocked: ${request.method()} ${path}` }, 404)
  return json(route, handler())
})

try {
  current = 'sign in'
  await page.goto(`${baseUrl}/login?redirect=/jobs/7`)
  await page.locator('input[data-test=username-input]').fill('ada')
  await page.locator('input[data-test=password-input]').fill('secret')
  await page.locator('[data-test=sign-in-submit]').click()
  await page.waitForURL((url) => url.pathname === '/jobs/7')

  current = 'job page'
  await settled(page, '[data-test=job-page]')
  await page.evaluate(() => (window.__deflNotReloaded = true))
  check(failures, (await page.locator('nav[aria-label=Main] a:visible').count()) === 6, 'the main menu does not show its six sections (an operator has Users)')
  check(failures, (await page.locator('[data-test=job-epsilon-max]').innerText()).includes('2.310'), "the job's maximum ε is not shown")
  check(failures, (await page.locator('[data-test=participants-table] [data-test=participant-epsilon]').allInnerTexts()).join(' ').startsWith('2.250 2.310 2.200'), "the participants' ε are not shown")
  check(failures, (await page.locator('[data-test=cancel-job]').count()) === 1, 'the proposer is not offered Cancel')
  check(failures, (await page.locator('[data-test=current-phase]').innerText()) === 'scoring', 'round 3 should be scoring first')
  // Polling moves the page on: round 3's model is fixed, then round 4 opens.
  await page.locator('[data-test=current-phase]', { hasText: 'training' }).waitFor({ timeout: 20000 })
  check(failures, await page.evaluate(() => window.__deflNotReloaded === true), 'the job page reloaded to show new rounds')
  check(failures, (await page.locator('[data-test=round-timeline] li').count()) === 4, 'the timeline should list 4 rounds')
  check(failures, (await page.locator('[data-test=metrics-chart] canvas').count()) > 0, 'the metrics chart is not drawn')
  const round3 = page.locator('.el-collapse-item__header', { hasText: 'Round 3' })
  if (!(await round3.getAttribute('class')).includes('is-active')) await round3.click()
  await page.locator('[data-test=round-3] [data-test=update-rejected]').waitFor({ state: 'visible', timeout: 5000 })
  check(failures, (await page.locator('[data-test=round-3] [data-test=update-accepted]').count()) === 2, 'round 3 should show 2 accepted updates')
  check(failures, (await page.locator('[data-test=round-3] tr.rejected-row').count()) === 1, 'round 3 should highlight 1 rejected update')
  check(failures, (await page.locator('[data-test=round-3] [data-test=round-transactions]').innerText()).includes('finalizeRound'), 'round 3 lacks its finalizeRound transaction')
  // Every decision with its reason, in percentages, nodes by name (the address on hover).
  check(failures, (await page.locator('[data-test=round-3] [data-test=base-median]').innerText()) === '77.0%', "round 3 does not show the base model's score")
  check(failures, (await page.locator('[data-test=round-3] [data-test=threshold]').innerText()) === '77.5%', 'round 3 does not show what an update had to beat')
  const reasons = await page.locator('[data-test=round-3] [data-test=update-reason]').allInnerTexts()
  check(failures, reasons.some((reason) => reason.includes("did not beat the base model's 77.0%")), `the rejected update's reason is missing: ${reasons.join(' | ')}`)
  const trainers = await page.locator('[data-test=round-3] [data-test=updates-table] [data-test=node-name]').allInnerTexts()
  check(failures, trainers.includes('org-c'), `the trainers are not named: ${trainers.join(', ')}`)
  check(failures, !(await page.locator('[data-test=round-3] [data-test=updates-table]').innerText()).includes('0xc4a1'), 'an address shows where a name is known')
  check(failures, (await page.locator('[data-test=round-3] [data-test=round-gas]').innerText()).includes('431,000 gas'), "round 3's gas is not shown")
  check(failures, (await page.locator('[data-test=job-gas-total]').innerText()) === '2,345,678', "the job's total gas is not shown")
  check(failures, (await page.locator('[data-test=joined-dataset]').innerText()) === 'clinic-a #1', 'the joined dataset is not named with its id')
  await page.waitForTimeout(400)
  await shots.shot(page, 'mocked-job')

  current = 'datasets page'
  await page.locator('[data-test=nav-datasets]').click()
  await settled(page, '[data-test=datasets-page]')
  check(failures, (await page.locator('[data-test=granted-to-me]').innerText()).includes('org-b'), 'the dataset granted to this node is not listed with its owner')
  current = 'dataset page'
  await page.locator('[data-test=datasets-table] a', { hasText: 'clinic-a' }).click()
  await settled(page, '[data-test=dataset-page]')
  check(failures, (await page.locator('[data-test=budget-spent]').innerText()) === '3.13', 'the budget shows the wrong spent epsilon')
  check(failures, (await page.locator('[data-test=budget-bar-spent]').getAttribute('style')).includes('31.3'), 'the budget bar is not drawn to scale')
  check(failures, (await page.locator('[data-test=budget-spends]').innerText()).includes('2.445'), 'the jobs that spent the budget are missing')
  check(failures, (await page.locator('[data-test=budget-explanation]').innerText()).includes('add up to 4.912'), "the composed total is not explained")
  check(failures, (await page.locator('[data-test=budget-group]').innerText()).includes('dataset 4'), 'the datasets sharing the budget are not named')
  // Revoking asks first; "Keep access" changes nothing, "Revoke" revokes.
  await page.locator('[data-test=revoke-grant]').click()
  await page.locator('.el-message-box').waitFor({ timeout: 5000 })
  await shots.shot(page, 'mocked-revoke-confirm')
  await page.locator('.el-message-box button', { hasText: 'Keep access' }).click()
  check(failures, !revoked, 'the grant was revoked without confirmation')
  await page.locator('[data-test=revoke-grant]').click()
  await page.locator('.el-message-box button', { hasText: 'Revoke' }).click()
  await page.locator('[data-test=grant-state]', { hasText: 'revoked' }).waitFor({ timeout: 10000 })
  check(failures, revoked, 'the grant was not revoked after confirming')
  await page.locator('.el-message-box').waitFor({ state: 'hidden', timeout: 5000 }).catch(() => {})
  await shots.shot(page, 'mocked-dataset')

  current = 'models page'
  await page.locator('[data-test=nav-models]').click()
  await settled(page, '[data-test=models-page]')
  check(failures, (await page.locator('[data-test=model-served]').count()) === 1, 'the served model is not marked')
  check(failures, (await page.locator('[data-test=models-table]').innerText()).includes('mnist-dp-eps3'), 'the models do not name their job')
  check(failures, (await page.locator('[data-test=model-accuracy]').first().innerText()) === '81.0%', 'the model accuracy is missing')
  check(failures, (await page.locator('[data-test=models-table] .el-tag--success', { hasText: 'verified' }).count()) === 2, 'model hashes not shown as verified')
  const [download] = await Promise.all([page.waitForEvent('download'), page.locator('[data-test=models-table] button', { hasText: 'Download' }).first().click()])
  check(failures, download.suggestedFilename() === 'defl-job7-round3.safetensors', `unexpected download name ${download.suggestedFilename()}`)
  // A sample of the wrong length is refused before it is sent, with a sentence.
  await page.locator('[data-test=predict-form] textarea').fill('0.1,0.2,0.3')
  await page.locator('[data-test=predict-submit]').click()
  await page.locator('[data-test=predict-form] .el-form-item__error', { hasText: 'takes 784 values' }).waitFor({ timeout: 5000 })
  await page.locator('[data-test=predict-form] textarea').fill(JSON.stringify(Array.from({ length: 784 }, (_v, i) => (i % 7) / 7)))
  await page.locator('[data-test=predict-submit]').click()
  await page.locator('[data-test=predict-result]').waitFor({ timeout: 10000 })
  check(failures, (await page.locator('[data-test=predict-result]').innerText()).includes('Prediction: 7'), 'the prediction is not shown')
  await shots.shot(page, 'mocked-models')

  current = 'job page on a phone'
  await page.setViewportSize(PHONE)
  await page.locator('[data-test=nav-jobs]').click()
  await settled(page, '[data-test=jobs-page]')
  await page.locator('[data-test=jobs-table] a', { hasText: 'mnist-dp-eps3' }).click()
  await settled(page, '[data-test=job-page]')
  await page.waitForTimeout(400)
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  check(failures, overflow <= 1, `the job page is ${overflow} px wider than a phone`)
  // The decision is on screen beside the trainer, and the table says it scrolls for the rest.
  const hint = page.locator('.scroll-hint:visible').first()
  await hint.waitFor({ timeout: 10000 }).catch(() => {})
  check(failures, (await page.locator('.scroll-hint:visible').count()) > 0, 'a round table does not say it scrolls on a phone')
  const decisionBox = await page.locator('[data-test=updates-table] :is([data-test=update-accepted], [data-test=update-rejected], [data-test=update-pending]):visible').first().boundingBox()
  check(failures, decisionBox && decisionBox.x + decisionBox.width <= 390, 'the decision column is off-screen on a phone')
  check(failures, (await page.locator('nav[aria-label=Main] a:visible').count()) === 6, 'the phone menu hides sections')
  await shots.shot(page, 'mocked-job-phone')
} catch (error) {
  failures.push(`${current}: ${error.message.split('\n')[0]}`)
  await shots.shot(page, 'mocked-failure').catch(() => {})
} finally {
  await browser.close()
}

failures.push(...errors)
for (const failure of failures) console.error(`FAIL ${failure}`)
console.log(JSON.stringify({ ok: failures.length === 0, failures, screenshots: shots.taken.length }))
process.exit(failures.length ? 1 : 0)
