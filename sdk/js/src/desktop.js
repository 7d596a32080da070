// `sandbox.desktop`: computer use on the `desktop` template's X display.
//
// Every action is a process in the guest (`xdotool`, `scrot`, the template's
// `lizard-desktop` script) run through the sandbox's exec API, so it needs no port of its
// own. The live view (`desktop.stream`) is noVNC through the sandbox URL of port 6080,
// behind a secret made per stream: a URL without it is answered 403 inside the guest.

import { randomBytes } from 'node:crypto'
import { LizardError } from './errors.js'

/** The guest port the live view listens on (reached through the sandbox URL). */
export const STREAM_PORT = 6080
/** The display every action targets (the template's DISPLAY). */
export const DISPLAY = ':0'

const BUTTONS = { left: 1, middle: 2, right: 3 }
const SCROLL = { up: 4, down: 5, left: 6, right: 7 }
/** Common key names → X keysyms (anything else goes to xdotool as it is). */
const KEYS = {
  enter: 'Return', return: 'Return', esc: 'Escape', escape: 'Escape', backspace: 'BackSpace', tab: 'Tab',
  space: 'space', delete: 'Delete', del: 'Delete', insert: 'Insert', home: 'Home', end: 'End',
  pageup: 'Page_Up', page_up: 'Page_Up', pagedown: 'Page_Down', page_down: 'Page_Down',
  up: 'Up', down: 'Down', left: 'Left', right: 'Right', ctrl: 'ctrl', control: 'ctrl', alt: 'alt',
  shift: 'shift', super: 'super', meta: 'super', win: 'super', cmd: 'super', capslock: 'Caps_Lock',
}

/** A desktop action failed inside the sandbox (the message carries the tool's stderr). */
export class DesktopError extends LizardError {}

function keysym(name) {
  const lower = name.toLowerCase()
  if (Object.hasOwn(KEYS, lower)) return KEYS[lower]
  if (/^f[0-9]{1,2}$/.test(lower)) return lower.toUpperCase()
  return name
}

function button(name) {
  if (!Object.hasOwn(BUTTONS, name)) throw new TypeError(`button must be one of left, middle, right; got ${name}`)
  return String(BUTTONS[name])
}

function coordinate(value, name) {
  if (!Number.isInteger(value) || value < 0) throw new TypeError(`${name} must be a non-negative integer, got ${value}`)
  return String(value)
}

/** `desktop.stream`: the live view, a noVNC page through the sandbox URL. */
export class DesktopStream {
  #desktop
  #secret = null
  constructor(desktop) {
    this.#desktop = desktop
  }

  /** The running stream's secret (null when none was started by this object). */
  get secret() {
    return this.#secret
  }

  /** Start the live view with a new secret (a running one is replaced; its URLs stop working). */
  async start() {
    const secret = randomBytes(24).toString('base64url')
    await this.#desktop._run(['lizard-desktop', 'stream-start'], { stdin: `${secret}\n` })
    this.#secret = secret
  }

  /**
   * The noVNC page of the running stream. `port`: the sandbox-URL proxy's port when it is
   * not the scheme's default. `viewOnly` asks noVNC to send no input (a viewer setting:
   * whoever holds the URL holds the secret).
   */
  getUrl({ viewOnly = false, port, scheme = 'http' } = {}) {
    if (this.#secret === null) throw new DesktopError('no stream: call desktop.stream.start() first')
    const host = this.#desktop._sandbox.getHost(STREAM_PORT)
    const origin = `${scheme}://${host}${port !== undefined ? `:${port}` : ''}`
    const query = new URLSearchParams({
      autoconnect: 'true',
      reconnect: 'true',
      resize: 'scale',
      view_only: viewOnly ? 'true' : 'false',
      path: `${this.#secret}/websockify`,
    })
    return `${origin}/${encodeURIComponent(this.#secret)}/vnc.html?${query}`
  }

  /** Stop the live view: x11vnc and the page end, every URL of it stops working. */
  async stop() {
    await this.#desktop._run(['lizard-desktop', 'stream-stop'])
    this.#secret = null
  }
}

/**
 * `sandbox.desktop`: mouse, keyboard, screenshots, apps and the live view of a sandbox of
 * the `desktop` template (or a template built on it).
 */
export class Desktop {
  constructor(sandbox) {
    this._sandbox = sandbox
    this.stream = new DesktopStream(this)
  }

  async _run(argv, { stdin, timeoutMs = 60_000 } = {}) {
    const result = await this._sandbox.process.exec(argv, { envs: { DISPLAY }, stdin, timeoutMs })
    if (result.exitCode !== 0) {
      const detail = (result.stderr || result.stdout).trim().slice(-2000)
      throw new DesktopError(`${argv[0]} ${argv[1] ?? ''} exited ${result.exitCode}: ${detail}`)
    }
    return result
  }

  _xdotool(...args) {
    return this._run(['xdotool', ...args])
  }

  /** The whole screen as PNG bytes. */
  async screenshot() {
    const path = `/tmp/lizard-screenshot-${randomBytes(8).toString('hex')}.png`
    const script = 'scrot -o "$1" && base64 -w0 "$1"; status=$?; rm -f "$1"; exit $status'
    const { stdout } = await this._run(['sh', '-c', script, 'screenshot', path])
    return new Uint8Array(Buffer.from(stdout, 'base64'))
  }

  /** `{ width, height }` of the screen in pixels. */
  async getScreenSize() {
    const [width, height] = (await this._xdotool('getdisplaygeometry')).stdout.trim().split(/\s+/).map(Number)
    return { width, height }
  }

  /** `{ x, y }` of the mouse pointer. */
  async getCursorPosition() {
    const { stdout } = await this._xdotool('getmouselocation', '--shell')
    const fields = Object.fromEntries(stdout.split('\n').filter((l) => l.includes('=')).map((l) => l.split('=', 2)))
    return { x: Number(fields.X), y: Number(fields.Y) }
  }

  /** Restart the desktop at `width` x `height` (open windows are closed). */
  async setResolution(width, height) {
    await this._run(['lizard-desktop', 'resize', `${coordinate(width, 'width')}x${coordinate(height, 'height')}`])
  }

  async #click(which, x, y, repeat = 1) {
    if ((x === undefined) !== (y === undefined)) throw new TypeError('give both x and y, or neither')
    const args = x !== undefined ? ['mousemove', '--sync', coordinate(x, 'x'), coordinate(y, 'y')] : []
    args.push('click')
    if (repeat > 1) args.push('--repeat', String(repeat), '--delay', '100')
    await this._xdotool(...args, button(which))
  }

  /** Click the left button (at `(x, y)` when given, else where the pointer is). */
  leftClick(x, y) {
    return this.#click('left', x, y)
  }
  rightClick(x, y) {
    return this.#click('right', x, y)
  }
  middleClick(x, y) {
    return this.#click('middle', x, y)
  }
  doubleClick(x, y) {
    return this.#click('left', x, y, 2)
  }

  async moveMouse(x, y) {
    await this._xdotool('mousemove', '--sync', coordinate(x, 'x'), coordinate(y, 'y'))
  }

  /** Press `button` (`left`, `middle`, `right`) and keep it down. */
  async mousePress(which = 'left') {
    await this._xdotool('mousedown', button(which))
  }
  async mouseRelease(which = 'left') {
    await this._xdotool('mouseup', button(which))
  }

  /** Press the left button at `from` (`[x, y]`), move to `to`, release. */
  async drag([x0, y0], [x1, y1]) {
    await this._xdotool(
      'mousemove', '--sync', coordinate(x0, 'x'), coordinate(y0, 'y'), 'mousedown', '1',
      'mousemove', '--sync', coordinate(x1, 'x'), coordinate(y1, 'y'), 'mouseup', '1',
    )
  }

  /** Scroll `amount` wheel steps `up`, `down`, `left` or `right`. */
  async scroll(direction = 'down', amount = 1) {
    if (!Object.hasOwn(SCROLL, direction)) throw new TypeError(`direction must be up, down, left or right; got ${direction}`)
    if (!Number.isInteger(amount) || amount < 1) throw new TypeError(`amount must be a positive integer, got ${amount}`)
    await this._xdotool('click', '--repeat', String(amount), '--delay', '50', String(SCROLL[direction]))
  }

  /** Type `text` into the focused window, `chunkSize` characters per call. */
  async write(text, { chunkSize = 50, delayInMs = 12 } = {}) {
    const step = Math.max(1, chunkSize)
    for (let i = 0; i < text.length; i += step) {
      await this._xdotool('type', '--delay', String(Math.max(0, delayInMs)), '--', text.slice(i, i + step))
    }
  }

  /** Press one key (`'enter'`, `'a'`, `'F5'`) or a chord of them together (`['ctrl', 'c']`). */
  async press(key) {
    const keys = Array.isArray(key) ? key : [key]
    if (!keys.length || !keys.every((k) => typeof k === 'string' && k)) {
      throw new TypeError('press needs a key name or a non-empty array of them')
    }
    await this._xdotool('key', '--', keys.map(keysym).join('+'))
  }

  /** Open a URL or a file in Chromium (resolves once it is launched, not loaded). */
  async open(urlOrFile) {
    await this._run(['lizard-desktop', 'open', urlOrFile])
  }

  /** Start `application` (a command line, run by `sh -c`) on the desktop, detached. */
  async launch(application) {
    await this._run(['lizard-desktop', 'launch', application])
  }

  /** Wait `ms` milliseconds (on the caller's side). */
  wait(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms))
  }
}
