// `sandbox.desktop` on the `desktop` template against a real server: the template's own
// size, a click on a page's button seen on the next screenshot (PNG decoded, pixels read),
// and the live view refused without its secret. (The Python suite also renders the live
// view in a real headless Chromium.)

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Lizard, DesktopError } from '../src/index.js'
import { server, myProject } from './helpers.js'
import { decodePng } from './png.js'

const BUTTON = [0, 0, 255]
const CLICKED = [0, 200, 0]
const PAGE = `<!doctype html><html><head><style>
  html, body { margin: 0; height: 100%; background: rgb(255, 255, 255); }
  #go { position: absolute; left: 150px; top: 80px; width: 240px; height: 120px; border: 0; background: rgb(${BUTTON}); }
</style></head><body><button id="go"></button><script>
  document.getElementById('go').onclick = (e) => {
    document.body.style.background = 'rgb(${CLICKED})'
    e.target.style.background = 'rgb(${CLICKED})'
  }
</script></body></html>`

let srv
let sandbox

before(async () => {
  srv = await server()
  await myProject()
  sandbox = await new Lizard({ project: 'my-project' }).create('desktop', { timeoutMs: 30 * 60_000 })
})

after(async () => {
  if (sandbox) await sandbox.kill()
})

const same = (a, b) => a[0] === b[0] && a[1] === b[1] && a[2] === b[2]

function boxOf(image, colour) {
  let box = null
  for (let y = 0; y < image.height; y += 2) {
    for (let x = 0; x < image.width; x += 2) {
      if (!same(image.pixel(x, y), colour)) continue
      box = box ? [Math.min(box[0], x), Math.min(box[1], y), Math.max(box[2], x), Math.max(box[3], y)] : [x, y, x, y]
    }
  }
  return box
}

async function screenUntil(ok, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const image = decodePng(await sandbox.desktop.screenshot())
    if (ok(image)) return image
    assert.ok(Date.now() < deadline, `${what}: not on screen within ${timeoutMs} ms`)
    await sandbox.desktop.wait(1000)
  }
}

function get(path) {
  const [hostname, port] = srv.proxy.split(':')
  return new Promise((resolve, reject) => {
    const req = http.get({ hostname, port, path, headers: { Host: sandbox.getHost(6080) } }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode))
    })
    req.on('error', reject)
    req.setTimeout(30_000, () => req.destroy(new Error('timed out')))
  })
}

test('the template brings its own size and a 1024x768 screen', async () => {
  assert.deepEqual([sandbox.info.vcpus, sandbox.info.memoryMib], [2, 2048])
  assert.deepEqual(await sandbox.desktop.getScreenSize(), { width: 1024, height: 768 })
  const image = decodePng(await sandbox.desktop.screenshot())
  assert.deepEqual([image.width, image.height], [1024, 768])
  await sandbox.desktop.moveMouse(300, 200)
  assert.deepEqual(await sandbox.desktop.getCursorPosition(), { x: 300, y: 200 })
  await assert.rejects(sandbox.desktop.press([]), TypeError)
  await assert.rejects(sandbox.desktop._run(['lizard-desktop', 'resize', '1x1']), DesktopError)
})

test('a left click on the button changes it, and the next screenshot shows it there', async () => {
  await sandbox.fs.write('/srv/jspage/index.html', PAGE)
  await sandbox.process.exec('cd /srv/jspage && nohup python3 -m http.server 8001 --bind 127.0.0.1 >/dev/null 2>&1 &')
  // Up before Chromium asks for the page: it retries a refused load only after growing
  // pauses (seconds, then minutes).
  await sandbox.waitForPort(8001)
  await sandbox.desktop.open('http://127.0.0.1:8001/')
  const image = await screenUntil((im) => boxOf(im, BUTTON) !== null, 180_000, "the page's button")
  const [left, top, right, bottom] = boxOf(image, BUTTON)
  const [x, y] = [(left + right) >> 1, (top + bottom) >> 1]
  await sandbox.desktop.leftClick(x, y)
  const after = await screenUntil((im) => same(im.pixel(x, y), CLICKED), 30_000, 'the clicked colour')
  assert.deepEqual(after.pixel(x, bottom + 30), CLICKED)
})

test('the live view needs its secret', async () => {
  const stream = sandbox.desktop.stream
  assert.throws(() => stream.getUrl(), DesktopError)
  await stream.start()
  const url = new URL(stream.getUrl({ viewOnly: true, port: 7172 }))
  assert.equal(url.hostname, sandbox.getHost(6080))
  assert.equal(url.port, '7172')
  assert.equal(url.searchParams.get('view_only'), 'true')
  assert.equal(url.searchParams.get('path'), `${stream.secret}/websockify`)
  assert.equal(await get(`/${stream.secret}/vnc.html`), 200)
  for (const path of ['/', '/vnc.html', '/websockify', `/${stream.secret.slice(1)}/vnc.html`]) {
    assert.equal(await get(path), 403, path)
  }
  const secret = stream.secret
  await stream.stop()
  assert.equal(stream.secret, null)
  assert.ok([502, 503].includes(await get(`/${secret}/vnc.html`)))
})
