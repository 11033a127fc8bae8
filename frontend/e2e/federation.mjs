// The whole federation through the dashboards of several nodes, as their operators would do it,
// by clicking (only the sign-in page is typed as a URL): upload a dataset on every node; grant
// node 1 access to node 0's dataset and see it listed on node 1, then revoke it (confirmed);
// create a job from the jobs page of node 0 (the wizard shows who can join; node 0 joins with its
// dataset in the same step), join it from every other node, start it once enough joined,
// watch the rounds complete and the accuracy chart draw (live, without a reload), open every round
// and list the trainers shown rejected (into the summary, with the job's path), download the
// served model and try it on a sample; then create a second job and cancel it; and follow the job
// on a 390 px phone.
//
// Needs a running local federation (several node processes on one chain, with the round driver).
//   DEFL_NODES=http://127.0.0.1:8101,http://127.0.0.1:8102,http://127.0.0.1:8103  first one creates the job
//   DEFL_OPERATOR_USER / DEFL_OPERATOR_PASSWORD   an operator account on every node
//   DEFL_DATASETS=/path/a.csv,/path/b.csv,/path/c.csv  one file per node (the attacker's may be label-flipped)
// Optional:
//   DEFL_LABEL_COLUMN (label)  DEFL_EPSILON_CAP (10)  DEFL_ROUNDS (3)  DEFL_COMMITTEE (1)  DEFL_TOP_K (1)
//   DEFL_MIN_TRAINERS (number of nodes - committee)  DEFL_MODEL (mlp)  DEFL_STRATEGY (fedavg)
//   DEFL_DP_MODE (sgd)  DEFL_TARGET_EPSILON (3)  DEFL_LR (0.05)  DEFL_BATCH_SIZE (32)
//   DEFL_ROUND_TIMEOUT_S (120)  DEFL_WAIT_S (900: how long the rounds may take in all)
//   DEFL_ATTACKER_ADDRESS (0x…: how often this trainer was rejected is reported)  DEFL_EXPECT_REJECTED (1)
//   DEFL_SCREENSHOTS (out/screenshots/federation)
// The last line printed is a JSON summary; exit status 0 only when every step passed.
import { readFileSync, statSync } from 'node:fs'
import { basename } from 'node:path'
import { PHONE, check, launch, requireEnv, screenshotter, settled, signIn, watchConsole } from './browser.mjs'

const env = (name, fallback) => process.env[name] || fallback
const nodes = requireEnv('DEFL_NODES').split(',').map((url) => url.trim().replace(/\/$/, ''))
const datasets = requireEnv('DEFL_DATASETS').split(',').map((path) => path.trim())
const user = requireEnv('DEFL_OPERATOR_USER')
const password = requireEnv('DEFL_OPERATOR_PASSWORD')
if (datasets.length !== nodes.length) {
  console.error(`DEFL_DATASETS has ${datasets.length} files for ${nodes.length} nodes`)
  process.exit(2)
}
const config = {
  label: env('DEFL_LABEL_COLUMN', 'label'),
  classes: env('DEFL_CLASSES', '0,1,2,3,4,5,6,7,8,9'),
  epsilonCap: env('DEFL_EPSILON_CAP', '10'),
  rounds: Number(env('DEFL_ROUNDS', '3')),
  committee: env('DEFL_COMMITTEE', '1'),
  topK: env('DEFL_TOP_K', '1'),
  minTrainers: env('DEFL_MIN_TRAINERS', String(Math.max(nodes.length - Number(env('DEFL_COMMITTEE', '1')), 1))),
  model: env('DEFL_MODEL', 'mlp'),
  strategy: env('DEFL_STRATEGY', 'fedavg'),
  dpMode: env('DEFL_DP_MODE', 'sgd'),
  targetEpsilon: env('DEFL_TARGET_EPSILON', '3'),
  lr: env('DEFL_LR', '0.05'),
  batchSize: env('DEFL_BATCH_SIZE', '32'),
  roundTimeout: env('DEFL_ROUND_TIMEOUT_S', '120'),
  waitMs: Number(env('DEFL_WAIT_S', '900')) * 1000,
  attacker: (process.env.DEFL_ATTACKER_ADDRESS || '').toLowerCase(),
  expectRejected: env('DEFL_EXPECT_REJECTED', '1') === '1',
}
const jobName = `e2e-federation-${Date.now()}`
let jobPath = ''
let rejectedShown = []
const shots = screenshotter(env('DEFL_SCREENSHOTS', 'out/screenshots/federation'))
const failures = []
const steps = []
const began = Date.now()
// Each step with the seconds since the start: a slow run says where its time went.
const step = (text) => steps.push(`${Math.round((Date.now() - began) / 1000)} s: ${text}`)
let current = 'start'

// Element Plus widgets, driven as a user would.
async function chooseOption(page, field, optionText) {
  await page.locator(`.el-form-item:has(.el-form-item__label:text-is("${field}")) .el-select`).click()
  await page.locator('.el-select-dropdown:visible .el-select-dropdown__item', { hasText: optionText }).first().click()
}
async function fillNumber(page, field, value) {
  const input = page.locator(`.el-form-item:has(.el-form-item__label:text-is("${field}")) input`)
  await input.fill(String(value))
  await input.blur()
}

// The main menu, as a user moves between sections.
async function openSection(page, name, selector) {
  await page.locator(`[data-test=nav-${name}]`).click()
  await settled(page, selector)
}

async function uploadDataset(page, baseUrl, file, index) {
  await openSection(page, 'datasets', '[data-test=upload-form]')
  const name = `${basename(file).replace(/\.[^.]+$/, '')}-${index}`
  await page.locator('input[data-test=file-input]').setInputFiles(file)
  await page.locator('input[data-test=name-input]').fill(name)
  if (file.endsWith('.csv')) await page.locator('input[data-test=label-input]').fill(config.label)
  await page.locator('input[data-test=classes-input]').fill(config.classes)
  await fillNumber(page, 'Privacy budget ε cap', config.epsilonCap)
  await page.locator('[data-test=upload-submit]').click()
  // The progress bar shows while the file goes up (small files may finish before we look).
  await page.locator('[data-test=upload-progress]').waitFor({ timeout: 10000 }).catch(() => {})
  const error = page.locator('[data-test=upload-error] .el-alert__title, [data-test=upload-form] .el-form-item__error').first()
  await Promise.race([page.waitForURL(/\/datasets\/[^/]+$/, { timeout: 120000 }), error.waitFor({ timeout: 120000 })])
  if (await error.count()) throw new Error(`the upload was refused: ${await error.innerText()}`)
  await settled(page, '[data-test=dataset-page]')
  await shots.shot(page, `node${index}-dataset`)
  return { name, id: new URL(page.url()).pathname.split('/').pop() }
}

async function createJob(page, name, dataset, { expectMembers = nodes.length } = {}) {
  await openSection(page, 'jobs', '[data-test=jobs-page]')
  await page.locator('[data-test=new-job]').click()
  await page.waitForURL((url) => url.pathname === '/jobs/new', { timeout: 20000 })
  await settled(page, '[data-test=job-form]')
  // The wizard knows who can join before anything is sent.
  await page.locator('[data-test=job-plan]', { hasText: `${expectMembers} member(s) can join` }).waitFor({ timeout: 30000 })
  await page.locator('input[data-test=job-name]').fill(name)
  await chooseOption(page, 'Model', config.model.toUpperCase() === 'MLP' ? 'MLP' : config.model)
  await chooseOption(page, 'Dataset this node brings', dataset.name)
  await chooseOption(page, 'Aggregation strategy', { fedavg: 'FedAvg', median: 'median', trimmed_mean: 'Trimmed', krum: 'Krum' }[config.strategy] || config.strategy)
  await fillNumber(page, 'Rounds', config.rounds)
  await fillNumber(page, 'Batch size', config.batchSize)
  await fillNumber(page, 'Learning rate', config.lr)
  await chooseOption(page, 'DP mode', { none: 'None', sgd: 'DP-SGD', update: 'Update-level' }[config.dpMode])
  if (config.dpMode !== 'none') await fillNumber(page, 'Target ε', config.targetEpsilon)
  await fillNumber(page, 'Committee size', config.committee)
  await fillNumber(page, 'Top-k accepted updates', config.topK)
  await fillNumber(page, 'Minimum trainers', config.minTrainers)
  await fillNumber(page, 'Round deadline (seconds)', config.roundTimeout)
  // The message is read only when there are problems: innerText() of a missing element waits out
  // Playwright's whole timeout (30 s) before it fails.
  const problems = page.locator('[data-test=job-plan-problems]')
  if (await problems.count()) check(failures, false, `the wizard refuses a startable job: ${await problems.innerText()}`)
  await shots.shot(page, `node0-job-form-${name.endsWith('-cancel') ? 'cancel' : 'main'}`)
  await page.locator('[data-test=job-submit]').click()
  const error = page.locator('[data-test=job-error] .el-alert__title, [data-test=job-form] .el-form-item__error').first()
  await Promise.race([page.waitForURL(/\/jobs\/\d[^/]*$/, { timeout: 120000 }), error.waitFor({ timeout: 120000 })])
  if (await error.count()) throw new Error(`the job was refused: ${await error.innerText()}`)
  await settled(page, '[data-test=job-page]')
  // Creating the job also joined it with the chosen dataset.
  await page.locator('[data-test=joined-dataset]', { hasText: dataset.name }).waitFor({ timeout: 60000 })
  check(failures, !(await page.locator('[data-test=join-form]').count()), 'the proposer is asked to join its own job again')
  return new URL(page.url()).pathname
}

// A job's id is its on-chain id, the same on every node; another node lists the job once its
// indexer picked it up from the chain (the jobs page refreshes itself).
async function openJob(page, name) {
  await openSection(page, 'jobs', '[data-test=jobs-page]')
  const link = page.locator('[data-test=jobs-table] a', { hasText: name })
  const deadline = Date.now() + 120000
  while (!(await link.count())) {
    if (Date.now() > deadline) throw new Error(`the job ${name} never appeared in the jobs list`)
    await page.waitForTimeout(2000)
    await openSection(page, 'jobs', '[data-test=jobs-page]')
  }
  await link.first().click()
  await settled(page, '[data-test=job-page]')
}

async function joinJob(page, dataset, index) {
  await openJob(page, jobName)
  await page.locator('[data-test=join-form]').waitFor({ timeout: 30000 })
  check(failures, !(await page.locator('[data-test=start-job]').count()) && !(await page.locator('[data-test=cancel-job]').count()), `node ${index} (not the proposer) is offered Start or Cancel`)
  await page.locator('[data-test=join-dataset]').click()
  await page.locator('.el-select-dropdown:visible .el-select-dropdown__item', { hasText: dataset.name }).first().click()
  await page.locator('[data-test=join-job]').click()
  await page.locator('.el-message--success').waitFor({ timeout: 60000 })
  await shots.shot(page, `node${index}-joined`)
}

async function grantAndRevoke(owner, grantee, dataset, granteeAddress) {
  current = 'node 0 grant'
  await owner.page.locator('[data-test=grant-node]').click()
  await owner.page.keyboard.type(granteeAddress)
  await owner.page.locator('.el-select-dropdown:visible .el-select-dropdown__item', { hasText: granteeAddress }).first().click()
  await owner.page.locator('[data-test=grant-submit]').click()
  await owner.page.locator('[data-test=grant-state]', { hasText: 'granted' }).waitFor({ timeout: 60000 })
  current = 'node 1 sees the grant'
  await openSection(grantee.page, 'datasets', '[data-test=datasets-page]')
  await grantee.page.locator('[data-test=granted-to-me] [data-test=granted-state]', { hasText: 'granted' }).waitFor({ timeout: 60000 })
  check(failures, (await grantee.page.locator('[data-test=granted-to-me]').innerText()).includes('org-a'), 'the grantee does not see the owner of the granted dataset')
  await shots.shot(grantee.page, 'node1-granted-to-me')
  current = 'node 0 revoke'
  await owner.page.locator('[data-test=revoke-grant]').click()
  await owner.page.locator('.el-message-box button', { hasText: 'Revoke' }).click()
  await owner.page.locator('[data-test=grant-state]', { hasText: 'revoked' }).waitFor({ timeout: 60000 })
  current = 'node 1 sees the revocation'
  await grantee.page.locator('[data-test=granted-to-me] [data-test=granted-state]', { hasText: 'revoked' }).waitFor({ timeout: 60000 })
  step(`dataset ${dataset.id} granted to node 1 and revoked`)
}

async function watchRounds(page) {
  // A marker on window survives only if the page is never reloaded: updates must come by polling.
  await page.evaluate(() => (window.__deflNotReloaded = true))
  const deadline = Date.now() + config.waitMs
  let lastPhase = ''
  let shotRound = 0
  for (;;) {
    const phase = await page.locator('[data-test=current-phase]').innerText().catch(() => '')
    const status = (await page.locator('[data-test=job-summary] .el-tag').first().innerText().catch(() => '')).toLowerCase()
    if (phase !== lastPhase) {
      step(`phase: ${phase} (${status})`)
      lastPhase = phase
    }
    const doneRounds = await page.locator('[data-test=round-timeline] .el-tag--success').count()
    if (doneRounds > shotRound) {
      shotRound = doneRounds
      await shots.shot(page, `node0-job-round${doneRounds}`)
    }
    if (['finished', 'done', 'completed'].includes(status) || doneRounds >= config.rounds) break
    if (['failed', 'cancelled', 'canceled'].includes(status)) throw new Error(`the job ended as ${status}`)
    if (Date.now() > deadline) throw new Error(`the rounds did not complete within ${config.waitMs / 1000} s (last phase ${phase})`)
    await page.waitForTimeout(2000)
  }
  check(failures, await page.evaluate(() => window.__deflNotReloaded === true), 'the job page reloaded while watching the rounds')
  // The newest round is the one open on the page.
  const openTitles = await page.locator('.el-collapse-item.is-active .el-collapse-item__header').allInnerTexts()
  check(failures, openTitles.some((title) => title.includes(`Round ${config.rounds}`)), `the newest round is not open (open: ${openTitles.join(', ')})`)
  await page.locator('[data-test=metrics-chart] canvas').first().waitFor({ timeout: 30000 })
  await page.waitForTimeout(500)
}

async function findRejectedUpdate(page) {
  // Open every round so that each updates table is on screen for the screenshot.
  const headers = page.locator('.el-collapse-item__header:not(.is-active)')
  for (let i = await headers.count(); i > 0; i -= 1) await headers.first().click()
  const rejected = page.locator('[data-test=update-rejected]')
  const count = await rejected.count()
  step(`rejected updates: ${count}`)
  if (config.expectRejected) check(failures, count > 0, 'no rejected update is shown')
  // Which trainers the page shows as rejected goes into the summary: the caller checks them
  // against the chain's decisions. Whether the committee caught the attacker is said, not checked:
  // at epsilon 3 a one-member committee's noisy scores of 600-record updates decide that by chance
  // in later rounds (in CI a label flipper was accepted in all three rounds it trained).
  rejectedShown = await page.locator('tr.rejected-row td:first-child [title]').evaluateAll((els) => els.map((el) => el.title.toLowerCase()))
  if (config.attacker) {
    const trained = await page.locator('[data-test=updates-table] tr td:first-child [title]').evaluateAll((els) => els.map((el) => el.title.toLowerCase()))
    const times = (list) => list.filter((trainer) => trainer === config.attacker).length
    step(`the attacker trained ${times(trained)} round(s) and was rejected in ${times(rejectedShown)}`)
  }
  await shots.shot(page, 'node0-job-final')
}

async function downloadAndPredict(page, baseUrl, csvFile) {
  await openSection(page, 'models', '[data-test=models-page]')
  check(failures, (await page.locator('[data-test=model-served]').count()) >= 1, 'no model is marked as served')
  check(failures, (await page.locator('[data-test=models-table]').innerText()).includes(jobName), 'the models do not name their job')
  await page.locator('[data-test=models-table] button:has-text("Download")').first().waitFor({ timeout: 60000 })
  const [download] = await Promise.all([page.waitForEvent('download'), page.locator('[data-test=models-table] button:has-text("Download")').first().click()])
  const path = await download.path()
  const bytes = readFileSync(path)
  // safetensors: an 8-byte little-endian header length, then a JSON header.
  const headerLength = Number(bytes.readBigUInt64LE(0))
  check(failures, bytes.length > 8 + headerLength && bytes[8] === 0x7b, `the downloaded model is not a safetensors file (${statSync(path).size} bytes)`)
  step(`model downloaded: ${download.suggestedFilename()} ${bytes.length} bytes`)
  if (csvFile?.endsWith('.csv')) {
    const [header, row] = readFileSync(csvFile, 'utf8').split(/\r?\n/)
    const labelIndex = header.split(',').indexOf(config.label)
    const features = row.split(',').filter((_value, index) => index !== labelIndex)
    await page.locator('[data-test=predict-form] textarea').fill(features.join(','))
    await page.locator('[data-test=predict-submit]').click()
    await page.locator('[data-test=predict-result]').waitFor({ timeout: 60000 })
    step(`prediction: ${(await page.locator('[data-test=predict-result] p').innerText()).trim()}`)
  }
  await shots.shot(page, 'node0-models')
}

const browser = await launch()
const pages = []
try {
  for (const [index, baseUrl] of nodes.entries()) {
    const page = await browser.context.newPage()
    const errors = watchConsole(page, () => current)
    pages.push({ page, baseUrl, errors })
    current = `node ${index} sign in`
    await signIn(page, baseUrl, user, password)
  }
  const uploaded = []
  for (const [index, { page, baseUrl }] of pages.entries()) {
    current = `node ${index} upload`
    uploaded.push(await uploadDataset(page, baseUrl, datasets[index], index))
    step(`node ${index}: dataset ${uploaded[index].name} stored as ${uploaded[index].id}`)
  }
  const [first] = pages
  if (pages.length > 1) await grantAndRevoke(first, pages[1], uploaded[0], process.env.DEFL_GRANTEE_ADDRESS || '')
  current = 'node 0 create job'
  jobPath = await createJob(first.page, jobName, uploaded[0])
  step(`job created and joined by node 0: ${jobPath}`)
  check(failures, (await first.page.locator('[data-test=start-waiting]').count()) === 1, 'Start is offered before enough nodes joined')
  for (const [index, { page }] of pages.entries()) {
    if (index === 0) continue
    current = `node ${index} join`
    await joinJob(page, uploaded[index], index)
    step(`node ${index} joined`)
  }
  current = 'node 0 start'
  // The job page follows the joins by itself; Start appears once enough participants joined.
  await first.page.locator('[data-test=start-job]').waitFor({ timeout: 120000 })
  await first.page.locator('[data-test=start-job]').click()
  current = 'node 0 rounds'
  await watchRounds(first.page)
  current = 'node 0 audit trail'
  await findRejectedUpdate(first.page)
  current = 'node 1 on a phone'
  const phone = pages[1].page
  await phone.setViewportSize(PHONE)
  await openJob(phone, jobName)
  await phone.waitForTimeout(500)
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  check(failures, overflow <= 1, `the job page is ${overflow} px wider than a phone`)
  await shots.shot(phone, 'node1-job-phone')
  current = 'node 0 models'
  await downloadAndPredict(first.page, first.baseUrl, datasets[0])
  current = 'node 0 cancel a job'
  const cancelPath = await createJob(first.page, `${jobName}-cancel`, uploaded[0])
  await first.page.locator('[data-test=cancel-job]').click()
  await first.page.locator('.el-message-box button', { hasText: 'Cancel job' }).click()
  await first.page.locator('[data-test=job-summary] .el-tag', { hasText: 'cancelled' }).waitFor({ timeout: 60000 })
  check(failures, !(await first.page.locator('[data-test=rounds-to-come]').count()), 'a cancelled job still shows rounds to come')
  check(failures, !(await first.page.locator('[data-test=cancel-job]').count()), 'a cancelled job still offers Cancel')
  await shots.shot(first.page, 'node0-job-cancelled')
  step(`job ${cancelPath} cancelled`)
} catch (error) {
  failures.push(`${current}: ${error.message.split('\n')[0]}`)
  for (const [index, { page }] of pages.entries()) await shots.shot(page, `failure-node${index}`).catch(() => {})
} finally {
  await browser.close()
}

for (const { errors } of pages) failures.push(...errors)
const summary = { ok: failures.length === 0, failures, steps, job: jobName, jobPath, rejected: rejectedShown, screenshots: shots.taken.length }
for (const failure of failures) console.error(`FAIL ${failure}`)
console.log(JSON.stringify(summary))
process.exit(summary.ok ? 0 : 1)
