// Shared set-up of the e2e scripts: Debian's Chromium through playwright-core, console
// error collection, screenshots, and signing in through the dashboard's own form.
import { chromium } from 'playwright-core'
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium'
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]
export const LAPTOP = { width: 1366, height: 860 }
export const TABLET = { width: 820, height: 1180 }
export const PHONE = { width: 390, height: 844 }

export function requireEnv(name) {
  const value = process.env[name]
  if (!value) {
    console.error(`environment variable ${name} is required`)
    process.exit(2)
  }
  return value.replace(/\/$/, '')
}

// A persistent context gives a fresh --user-data-dir we own and delete afterwards.
export async function launch() {
  const userDataDir = mkdtempSync(join(tmpdir(), 'defl-chromium-'))
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: LAPTOP,
    reducedMotion: 'reduce', // charts skip their animation, so screenshots are final
    acceptDownloads: true,
  })
  // No CSS transitions or animations: Element Plus's dropdowns slide in, and Playwright waits for
  // an element to hold still over two animation frames before it clicks; on a loaded machine the
  // frames are slow and every select cost seconds. Nothing checked depends on motion.
  await context.addInitScript(() => {
    // Init scripts run before the document has an element: add the style once it has one.
    const still = () => {
      const style = document.createElement('style')
      style.textContent = '*, *::before, *::after { transition: none !important; animation: none !important; }'
      document.documentElement.appendChild(style)
    }
    if (document.documentElement) still()
    else new MutationObserver((_changes, observer) => {
      if (document.documentElement) {
        observer.disconnect()
        still()
      }
    }).observe(document, { childList: true })
  })
  return {
    context,
    async close() {
      await context.close()
      rmSync(userDataDir, { recursive: true, force: true })
    },
  }
}

// Every console error and uncaught exception, labelled with the page being checked.
export function watchConsole(page, where) {
  const errors = []
  page.on('console', (message) => {
    if (message.type() === 'error') errors.push(`${where()}: console: ${message.text()} ${message.location()?.url || ''}`.trim())
  })
  page.on('pageerror', (error) => errors.push(`${where()}: uncaught: ${error.message}`))
  return errors
}

export function screenshotter(dir) {
  mkdirSync(dir, { recursive: true })
  const taken = []
  return {
    taken,
    async shot(page, name) {
      const path = join(dir, `${name}.png`)
      await page.screenshot({ path, fullPage: true })
      taken.push(path)
      return path
    },
  }
}

export async function signIn(page, baseUrl, username, password) {
  await page.goto(`${baseUrl}/login`)
  await page.locator('input[data-test=username-input]').fill(username)
  await page.locator('input[data-test=password-input]').fill(password)
  await page.locator('[data-test=sign-in-submit]').click()
  await page.waitForURL((url) => !url.pathname.startsWith('/login'), { timeout: 20000 })
}

export async function signOut(page) {
  await page.locator('[data-test=sign-out]').click()
  await page.waitForURL((url) => url.pathname.startsWith('/login'), { timeout: 20000 })
}

// Wait until a page's first data arrived: no skeleton left in it.
export async function settled(page, selector) {
  await page.locator(selector).waitFor({ timeout: 20000 })
  await page.waitForFunction(() => !document.querySelector('[data-test=loading]'), null, { timeout: 20000 })
  await page.waitForTimeout(300)
}

export function check(failures, condition, message) {
  if (!condition) failures.push(message)
  return condition
}
