// The web console in a real browser (Debian's Chromium, driven by Playwright) against a
// real `lizard server` with real sandboxes: scripts/test-sdk.sh console starts the server
// and sets LIZARD_SDK_TEST_API_URL / LIZARD_SDK_TEST_API_KEY (the owner's key).
//
// With LIZARD_CONSOLE_SCREENSHOTS=DIR, every page is also saved as DIR/<page>.png (the
// pictures in docs/console.md).

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { chromium } from 'playwright-core'

const API = process.env.LIZARD_SDK_TEST_API_URL
const OWNER = process.env.LIZARD_SDK_TEST_API_KEY
assert.ok(API && OWNER, 'run through scripts/test-sdk.sh console (LIZARD_SDK_TEST_API_URL and _KEY)')
const SHOTS = process.env.LIZARD_CONSOLE_SCREENSHOTS
if (SHOTS) mkdirSync(SHOTS, { recursive: true })
// Creating from a template snapshot takes seconds; the first create of a size boots it.
const CREATE_MS = 240_000
// The sandbox-URL proxy's port, for the links to open ports.
const SANDBOX_URL_PORT = (process.env.LIZARD_SDK_TEST_PROXY ?? '').split(':')[1]

async function call(method, path, key, body) {
  const resp = await fetch(API + path, {
    method,
    headers: { 'X-API-Key': key, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(CREATE_MS),
  })
  const text = await resp.text()
  return { status: resp.status, body: text ? JSON.parse(text) : null }
}

async function ok(method, path, key, body) {
  const r = await call(method, path, key, body)
  assert.ok(r.status < 300, `${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`)
  return r.body
}

const tag = Math.random().toString(36).slice(2, 8)
const made = { sandboxes: [], workspaces: [] }
let browser
let a
let b
let scopedKey

before(async () => {
  // Two workspaces with a project each; a key scoped to the first.
  for (const name of ['a', 'b']) {
    const ws = await ok('POST', '/v1/workspaces', OWNER, { name: `console-${name}-${tag}` })
    made.workspaces.push(ws.id)
    const project = await ok('POST', '/v1/projects', OWNER, { workspaceId: ws.id, name: `console-${name}` })
    if (name === 'a') a = { ws, project }
    else b = { ws, project }
  }
  scopedKey = (await ok('POST', '/v1/api-keys', OWNER, { name: `console-scoped-${tag}`, workspaces: [a.ws.id] })).key
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM_BIN || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu'],
  })
})

after(async () => {
  await browser?.close()
  for (const id of made.sandboxes) await call('DELETE', `/v1/sandboxes/${id}`, OWNER)
  for (const id of made.workspaces) await call('DELETE', `/v1/workspaces/${id}?force=true`, OWNER)
})

/** A fresh browser context signed in with `key`; fails the test on any page error or CSP violation. */
async function signedIn(key) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } })
  const page = await context.newPage()
  const problems = []
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`))
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused to/i.test(m.text())) problems.push(m.text())
  })
  const resp = await page.goto(`${API}/`)
  assert.equal(resp.status(), 200)
  assert.ok(page.url().endsWith('/console/'), page.url())
  assert.match(resp.headers()['content-security-policy'], /script-src 'self'/)
  await page.fill('#api-key', key)
  await page.click('button[type=submit]')
  await page.waitForSelector('header nav')
  return { context, page, problems }
}

async function shot(page, name) {
  if (SHOTS) await page.screenshot({ path: join(SHOTS, `${name}.png`) })
}

/** The terminal's rendered rows as text (xterm.js's DOM renderer writes spaces as NBSPs). */
async function screenRows(page) {
  return page.$$eval('#terminal .xterm-rows > div', (rows) => rows.map((r) => r.textContent.replace(/\u00a0/g, ' ').trimEnd()))
}

/** Type `line` and Enter into the terminal, then wait for a rendered row that `want` matches. */
async function run(page, line, want) {
  await page.click('#terminal')
  await page.keyboard.type(line)
  await page.keyboard.press('Enter')
  try {
    await page.waitForFunction(
      (src) => [...document.querySelectorAll('#terminal .xterm-rows > div')]
        .some((r) => new RegExp(src).test(r.textContent.replace(/\u00a0/g, ' ').trim())),
      want.source,
      { timeout: 60_000 },
    )
  } catch (e) {
    assert.fail(`${line}: no row matches ${want}:\n${(await screenRows(page)).join('\n')}\n${e.message}`)
  }
  return (await screenRows(page)).map((r) => r.trim()).find((r) => want.test(r))
}

test('every page shows what the API says, and its forms work', async () => {
  const sbx = await ok('POST', '/v1/sandboxes', OWNER, { template: 'base', projectId: a.project.id, timeoutMs: 600_000 })
  made.sandboxes.push(sbx.sandboxId)
  await ok('POST', `/v1/sandboxes/${sbx.sandboxId}/exec`, OWNER, { cmd: 'mkdir -p /root/app && echo hello > /root/app/hello.txt && (python3 -m http.server 8000 --directory /root/app >/dev/null 2>&1 &)' })
  const { context, page, problems } = await signedIn(OWNER)
  // The key is in this tab's session storage only: not in the URL, cookies or local storage.
  assert.equal(await page.evaluate(() => sessionStorage.getItem('lizard.apiKey')), OWNER)
  assert.equal(await page.evaluate(() => localStorage.length), 0)
  assert.deepEqual(await context.cookies(), [])
  assert.ok(!page.url().includes(OWNER))

  await page.waitForSelector(`#sandbox-list a:text("${sbx.sandboxId}")`, { timeout: 60_000 })
    .catch(async (e) => assert.fail(`no row for ${sbx.sandboxId}: ${await page.textContent('main')}\n${e.message}`))
  const row = await page.textContent(`#sandbox-list tr:has(a:text("${sbx.sandboxId}"))`)
  assert.match(row, /running/)
  assert.match(row, /base/)
  assert.match(row, /\$\d/, 'cost so far')
  await shot(page, 'sandboxes')

  // The page's first listing (of /root) answers late, after the one asked for below: the
  // listing asked for last is the one shown.
  await page.route(/\/files\/list\?path=%2Froot$/, async (route) => {
    await new Promise((resolve) => setTimeout(resolve, 1500))
    await route.continue()
  }, { times: 1 })
  await page.click(`#sandbox-list a:text("${sbx.sandboxId}")`)
  await page.waitForSelector('#sandbox-facts')
  await page.fill('#file-path', '/root/app')
  await page.click('form:has(#file-path) button')
  await page.waitForSelector('#file-list :text("hello.txt")')
  await page.waitForTimeout(2000)
  assert.ok(await page.isVisible('#file-list :text("hello.txt")'), 'the late first listing replaced the one asked for')
  assert.equal(await page.inputValue('#file-path'), '/root/app')
  const download = page.waitForEvent('download')
  await page.click('#file-list tr:has-text("hello.txt") button')
  const file = await download
  assert.equal(file.suggestedFilename(), 'hello.txt')
  const { readFile } = await import('node:fs/promises')
  assert.equal(await readFile(await file.path(), 'utf8'), 'hello\n')
  await page.setInputFiles('#upload-file', { name: 'up.txt', mimeType: 'text/plain', buffer: Buffer.from('uploaded\n') })
  await page.click('form:has(#upload-file) button')
  await page.waitForSelector('#file-list :text("up.txt")')
  const read = await fetch(`${API}/v1/sandboxes/${sbx.sandboxId}/files?path=/root/app/up.txt`, { headers: { 'X-API-Key': OWNER } })
  assert.equal(await read.text(), 'uploaded\n')
  // python3's server on 8000 (started detached above; under TCG and load it takes a while).
  const deadline = Date.now() + 120_000
  while (!(await page.$('#port-list a')) && Date.now() < deadline) {
    await page.waitForTimeout(2000)
    await page.click('button:text("Scan again")')
  }
  assert.ok(await page.$('#port-list a'), `no open port listed: ${await page.textContent('#port-list')}`)
  const link = await page.getAttribute('#port-list a', 'href')
  assert.equal(link, `http://${sbx.sandboxId}-8000.${sbx.domain}:${SANDBOX_URL_PORT}/`)
  // From the guest's agent: the process that listens; never the platform's own ports.
  const ports = await page.textContent('#port-list')
  assert.match(ports, /http\.server/)
  assert.ok(!ports.includes('49171'), ports)
  await page.waitForSelector('#terminal-status:text("Connected")', { timeout: 60_000 })
  await run(page, 'echo hi', /^hi$/)
  await page.evaluate(() => window.scrollTo(0, 0))
  await shot(page, 'sandbox')

  for (const name of ['templates', 'volumes', 'keys', 'usage']) {
    await page.goto(`${API}/console/#/${name}`)
    await page.waitForSelector('main h1')
    await page.waitForLoadState('networkidle')
    if (name === 'templates') assert.match(await page.textContent('main'), /code-interpreter-v1/)
    if (name === 'volumes') {
      await page.fill('form.inline input[name=name]', `vol-${tag}`)
      await page.click('form.inline button[type=submit]')
      await page.waitForSelector(`#volume-list :text("vol-${tag}")`)
    }
    if (name === 'keys') {
      await page.fill('#key-name', `made-in-console-${tag}`)
      await page.selectOption('#key-workspace', a.ws.id)
      await page.click('form.inline button[type=submit]')
      const key = (await page.textContent('#new-key-value')).trim()
      assert.match(key, /^lz_/)
      const whoami = await ok('GET', '/v1/whoami', key)
      assert.deepEqual([whoami.scoped, whoami.workspaces], [true, [a.ws.id]])
      await page.waitForSelector(`#key-list :text("made-in-console-${tag}")`)
    }
    if (name === 'usage') {
      await page.waitForSelector('#balance')
      assert.match(await page.textContent('#balance'), /\$\d/)
    }
    await shot(page, name)
  }
  assert.deepEqual(problems, [])
  await context.close()
})

test('sign in, create a sandbox from the form, use its terminal, kill it from its page', async () => {
  const { context, page, problems } = await signedIn(OWNER)
  await page.selectOption('#create-project', a.project.id)
  await page.selectOption('#create-template', 'base')
  await page.click('#create-sandbox button[type=submit]')
  await page.waitForURL(/#\/sandboxes\/[a-z0-9]+(\?pid=\d+)?$/, { timeout: CREATE_MS })
  const id = decodeURIComponent(page.url().split('#/sandboxes/')[1].split('?')[0])
  made.sandboxes.push(id)
  const created = await ok('GET', `/v1/sandboxes/${id}`, OWNER)
  assert.deepEqual([created.state, created.template, created.projectId], ['running', 'base', a.project.id])
  await page.waitForSelector('#sandbox-facts .state.running')

  // The terminal: a shell in the sandbox, over the PTY WebSocket with the key as a subprotocol.
  await page.waitForSelector('#terminal-status:text("Connected")', { timeout: 60_000 })
  const shellPid = Number((await page.textContent('#terminal-status')).match(/pid (\d+)/)[1])
  const shell = (await ok('GET', `/v1/sandboxes/${id}/processes`, OWNER)).find((p) => p.pid === shellPid)
  assert.deepEqual([shell?.pty, shell?.exitCode], [true, undefined], `the shell, ${shellPid}`)
  await run(page, 'echo hi', /^hi$/)
  assert.ok((await screenRows(page)).some((r) => r.includes('echo hi')), 'the typed line is echoed')
  // The PTY starts at the size the page fits (rows: the rendered rows), and follows the window.
  const before = (await run(page, 'clear; stty size', /^\d+ \d+$/)).split(' ').map(Number)
  assert.equal(before[0], (await screenRows(page)).length)
  await page.setViewportSize({ width: 760, height: 800 })
  const after = (await run(page, 'clear; stty size', new RegExp(`^${before[0]} (?!${before[1]}$)\\d+$`))).split(' ').map(Number)
  assert.ok(after[1] < before[1], `narrower window, ${before} → ${after}`)
  // Leaving the page closes the socket, which hangs the shell up; coming back starts another.
  await page.evaluate(() => { location.hash = '#/sandboxes' })
  await page.waitForSelector('#sandbox-list')
  let ended
  for (let i = 0; i < 60 && ended?.exitCode === undefined; i++) {
    if (i) await page.waitForTimeout(500)
    ended = (await ok('GET', `/v1/sandboxes/${id}/processes`, OWNER)).find((p) => p.pid === shellPid)
  }
  assert.notEqual(ended?.exitCode, undefined, 'the shell ended when its page was left')
  await page.click(`#sandbox-list a:text("${id}")`)
  await page.waitForSelector('#terminal-status:text("Connected")', { timeout: 60_000 })
  assert.notEqual((await page.textContent('#terminal-status')).match(/pid (\d+)/)[1], String(shellPid))
  // The shell's own end is the server's `exit` message.
  await page.click('#terminal')
  await page.keyboard.type('exit 3')
  await page.keyboard.press('Enter')
  await page.waitForSelector('#terminal-status:text("The shell exited (3).")', { timeout: 60_000 })

  await page.click('#kill')
  await page.waitForURL(/#\/sandboxes$/)
  assert.equal((await call('GET', `/v1/sandboxes/${id}`, OWNER)).status, 404, 'killed')
  await page.waitForSelector('#sandbox-list')
  assert.ok(!(await page.textContent('#sandbox-list')).includes(id))
  assert.deepEqual(problems, [])
  await context.close()
})

/** The shell pid the terminal status names, once it says Connected. */
async function connectedPid(page) {
  await page.waitForSelector('#terminal-status:text("Connected")', { timeout: 60_000 })
  return Number((await page.textContent('#terminal-status')).match(/pid (\d+)/)[1])
}

test('the terminal reattaches after a reload and in a second tab; an ended shell offers a new one', async () => {
  const sbx = await ok('POST', '/v1/sandboxes', OWNER, { template: 'base', projectId: a.project.id, timeoutMs: 600_000 })
  made.sandboxes.push(sbx.sandboxId)
  const { context, page, problems } = await signedIn(OWNER)
  await page.goto(`${API}/console/#/sandboxes/${sbx.sandboxId}`)
  const pid = await connectedPid(page)
  // The page's address names the shell once it runs.
  await page.waitForURL(new RegExp(`#/sandboxes/${sbx.sandboxId}\\?pid=${pid}$`))
  await run(page, 'export MARK=$((40+2)); echo marked', /^marked$/)
  const url = page.url()

  // A reload: the same shell (its variable is still set), its earlier output replayed.
  await page.reload()
  assert.equal(await connectedPid(page), pid)
  assert.equal(page.url(), url)
  await page.waitForFunction(() => document.querySelector('#terminal .xterm-rows').textContent.includes('export MARK'))
  await run(page, 'echo $MARK', /^42$/)

  // A second tab on the same address sees the same shell and what the first one types.
  const second = await signedIn(OWNER)
  await second.page.goto(url)
  assert.equal(await connectedPid(second.page), pid)
  await second.page.waitForFunction(() => [...document.querySelectorAll('#terminal .xterm-rows > div')]
    .some((r) => r.textContent.replace(/\u00a0/g, ' ').trim() === '42'))
  await run(page, 'echo from-first-$MARK', /^from-first-42$/)
  await second.page.waitForFunction(() => [...document.querySelectorAll('#terminal .xterm-rows > div')]
    .some((r) => r.textContent.replace(/\u00a0/g, ' ').trim() === 'from-first-42'))
  await run(second.page, 'echo from-second', /^from-second$/)
  const shells = (await ok('GET', `/v1/sandboxes/${sbx.sandboxId}/processes`, OWNER)).filter((p) => p.pty && p.exitCode === undefined)
  assert.deepEqual(shells.map((p) => p.pid), [pid], 'one shell, shared')
  assert.deepEqual(second.problems, [])
  await second.context.close()

  // The shell's end: a clear message, and a button for a new shell, also after a reload.
  await page.click('#terminal')
  await page.keyboard.type('exit 5')
  await page.keyboard.press('Enter')
  await page.waitForSelector('#terminal-status:text("The shell exited (5).")', { timeout: 60_000 })
  await page.waitForSelector('#new-shell:visible')
  await page.reload()
  await page.waitForSelector('#terminal-status:text("The shell exited (5).")', { timeout: 60_000 })
    .catch(async (e) => assert.fail(`after a reload: ${await page.textContent('#terminal-status')}\n${e.message}`))
  await page.waitForSelector('#new-shell:visible')
  // A pid that is no shell here: said so, nothing opened.
  await page.goto(`${API}/console/#/sandboxes/${sbx.sandboxId}?pid=999999`)
  await page.waitForSelector('#terminal-status:text("There is no shell 999999")')
  await page.click('#new-shell')
  const fresh = await connectedPid(page)
  assert.notEqual(fresh, pid)
  await page.waitForURL(new RegExp(`\\?pid=${fresh}$`))
  await run(page, 'echo "[$MARK]"', /^\[\]$/)
  assert.deepEqual(problems, [])
  await context.close()
})

test('a key scoped to one workspace sees only that workspace', async () => {
  const mine = await ok('POST', '/v1/sandboxes', OWNER, { template: 'base', projectId: a.project.id, timeoutMs: 600_000 })
  made.sandboxes.push(mine.sandboxId)
  const theirs = await ok('POST', '/v1/sandboxes', OWNER, { template: 'base', projectId: b.project.id, timeoutMs: 600_000 })
  made.sandboxes.push(theirs.sandboxId)
  const { context, page, problems } = await signedIn(scopedKey)
  await page.waitForSelector(`#sandbox-list a:text("${mine.sandboxId}")`, { timeout: 60_000 })
    .catch(async (e) => assert.fail(`no row for ${mine.sandboxId}: ${await page.textContent('main')}\n${e.message}`))
  const listed = await page.textContent('#sandbox-list')
  assert.ok(!listed.includes(theirs.sandboxId), 'another workspace\'s sandbox is listed')
  const projects = await page.$$eval('#create-project option', (o) => o.map((x) => x.value))
  assert.deepEqual(projects, [a.project.id])
  // Cost so far comes from the server, which sums it for a scoped key's own sandboxes too.
  const row = await page.textContent(`#sandbox-list tr:has(a:text("${mine.sandboxId}"))`)
  assert.match(row, /\$\d/, 'cost so far')
  const costs = await ok('GET', `/v1/billing/sandboxes?ids=${mine.sandboxId},${theirs.sandboxId}`, scopedKey)
  assert.deepEqual(costs.map((c) => c.sandboxId), [mine.sandboxId])
  // A list that fails to load says why, and shows the sandboxes at the next refresh.
  await page.goto(`${API}/console/#/usage`)
  await page.waitForSelector('#usage-cost')
  await page.route(/\/v1\/sandboxes$/, (route) => route.fulfill({
    status: 503, contentType: 'application/json', body: JSON.stringify({ code: 'UNAVAILABLE', message: 'try again' }),
  }), { times: 1 })
  await page.goto(`${API}/console/#/sandboxes`)
  await page.waitForSelector('#sandbox-list-errors .error:text("UNAVAILABLE: try again")')
  await page.waitForSelector(`#sandbox-list a:text("${mine.sandboxId}")`)
  assert.equal(await page.textContent('#sandbox-list-errors'), '')
  // Another workspace's sandbox by its URL: the API's 404, shown as such.
  await page.goto(`${API}/console/#/sandboxes/${theirs.sandboxId}`)
  await page.waitForSelector('.error[role=alert]')
  assert.match(await page.textContent('.error[role=alert]'), /NOT_FOUND/)
  await page.goto(`${API}/console/#/usage`)
  await page.waitForSelector('#usage-cost')
  assert.match(await page.textContent('main'), /an unscoped key sees them/)
  await page.goto(`${API}/console/#/keys`)
  await page.waitForSelector('#key-list')
  assert.ok(!(await page.textContent('#key-workspace')).includes('unscoped'))
  assert.deepEqual(problems, [])
  await context.close()
})
