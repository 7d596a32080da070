// The sandbox's terminal: xterm.js over the PTY WebSocket of the public API
// (GET /v1/sandboxes/{id}/pty): binary frames are the terminal's bytes both ways, text
// frames are JSON (ours: resize; the server's: started, exit, error). A browser cannot set
// headers on a WebSocket, so the key goes in the handshake's Sec-WebSocket-Protocol list
// (`lizard.key.<key>`, beside `lizard.pty`, the protocol the server answers with), never
// in the URL. The socket asks for `detach=true`: closing it (a reload, a tab closed) leaves
// the shell running, and `pid=` reattaches to it with its kept output replayed; leaving
// the page inside the console hangs the shell up (`close(true)`), as closing a terminal
// window does.

import { FitAddon } from '@xterm/addon-fit'
import { Terminal } from '@xterm/xterm'
import * as api from './api'

export const PROTOCOL = 'lizard.pty'
export const KEY_PROTOCOL_PREFIX = 'lizard.key.'

/** What the server sends as text frames. */
type ServerMessage =
  | { type: 'started', pid: number }
  | { type: 'exit', exitCode: number }
  | { type: 'error', code: string, message: string }

/** How the terminal tells its page what happens. */
export interface TerminalEvents {
  /** How the connection stands, in words. */
  status(s: string): void
  /** The shell runs (a new one or the one reattached to) as `pid`. */
  started(pid: number): void
  /** The shell ended or the connection broke off. */
  ended(): void
}

/** Open a terminal on sandbox `id` in `el`, sized to it: a new shell, or the running shell
 * `pid`. Returns what closes it (once; later calls do nothing), with `hangUp` ending the
 * shell too. */
export function openTerminal(el: HTMLElement, id: string, pid: number | undefined, on: TerminalEvents): (hangUp?: boolean) => void {
  const term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000 })
  const fit = new FitAddon()
  term.loadAddon(fit)
  term.open(el)
  fit.fit()
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:'
  const url = `${scheme}//${location.host}/v1/sandboxes/${api.enc(id)}/pty` + api.q({ cols: term.cols, rows: term.rows, pid, detach: true })
  const ws = new WebSocket(url, [PROTOCOL, KEY_PROTOCOL_PREFIX + (api.key() ?? '')])
  ws.binaryType = 'arraybuffer'
  const encoder = new TextEncoder()
  let ended = ''
  let shellPid: number | undefined
  const send = (data: string | Uint8Array): void => { if (ws.readyState === WebSocket.OPEN) ws.send(data) }
  ws.onopen = () => {
    term.focus()
    // A reattached shell keeps the size it had: give it this window's.
    if (pid !== undefined) send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }))
  }
  ws.onmessage = (m) => {
    if (m.data instanceof ArrayBuffer) return term.write(new Uint8Array(m.data))
    const msg = JSON.parse(String(m.data)) as ServerMessage
    if (msg.type === 'started') {
      shellPid = msg.pid
      on.status(`Connected (shell pid ${msg.pid}).`)
      on.started(msg.pid)
    } else if (msg.type === 'exit') ended = `The shell exited (${msg.exitCode}).`
    else if (msg.type === 'error') ended = `${msg.code}: ${msg.message}`
  }
  // A refused handshake (a wrong key, a sandbox gone) shows here as a close without
  // reason: the browser keeps the HTTP answer from the page.
  ws.onclose = (e) => {
    on.status(ended || `Disconnected (${e.code}${e.reason ? ': ' + e.reason : ''}).`)
    on.ended()
  }
  const input = term.onData((d) => send(encoder.encode(d)))
  const resized = term.onResize(({ cols, rows }) => send(JSON.stringify({ type: 'resize', cols, rows })))
  const onWindow = (): void => fit.fit()
  window.addEventListener('resize', onWindow)
  let closed = false
  return (hangUp = false) => {
    if (closed) return
    closed = true
    if (hangUp && shellPid !== undefined) {
      const signal = `/v1/sandboxes/${api.enc(id)}/processes/${shellPid}/signal`
      api.call('POST', signal, { signal: 'SIGHUP' }).catch((e) => console.warn(e))
    }
    window.removeEventListener('resize', onWindow)
    input.dispose()
    resized.dispose()
    ws.onclose = null
    ws.close()
    term.dispose()
  }
}
