// The sandbox's terminal: xterm.js over the PTY WebSocket of the public API
// (GET /v1/sandboxes/{id}/pty): binary frames are the terminal's bytes both ways, text
// frames are JSON (ours: resize; the server's: started, exit, error). A browser cannot set
// headers on a WebSocket, so the key goes in the handshake's Sec-WebSocket-Protocol list
// (`lizard.key.<key>`, beside `lizard.pty`, the protocol the server answers with) — never
// in the URL.

import { Terminal } from '@xterm/xterm'
import { FitAddon } from '@xterm/addon-fit'
import * as api from './api'

export const PROTOCOL = 'lizard.pty'
export const KEY_PROTOCOL_PREFIX = 'lizard.key.'

/** Open a terminal on sandbox `id` in `el`; returns what closes it. */
export function openTerminal(el: HTMLElement, id: string, status: (s: string) => void): () => void {
  const term = new Terminal({ cursorBlink: true, fontSize: 13, convertEol: false, scrollback: 5000 })
  const fit = new FitAddon()
  term.loadAddon(fit)
  term.open(el)
  fit.fit()
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:'
  const url = `${scheme}//${location.host}/v1/sandboxes/${api.enc(id)}/pty` + api.q({ cols: term.cols, rows: term.rows })
  const ws = new WebSocket(url, [PROTOCOL, KEY_PROTOCOL_PREFIX + (api.key() ?? '')])
  ws.binaryType = 'arraybuffer'
  const encoder = new TextEncoder()
  ws.onopen = () => term.focus()
  let ended = ''
  ws.onmessage = (m) => {
    if (m.data instanceof ArrayBuffer) return term.write(new Uint8Array(m.data))
    const msg = JSON.parse(String(m.data))
    if (msg.type === 'started') status(`Connected (shell pid ${msg.pid}).`)
    else if (msg.type === 'exit') ended = `The shell exited (${msg.exitCode}).`
    else if (msg.type === 'error') ended = `${msg.code}: ${msg.message}`
  }
  ws.onclose = (e) => status(ended || `Disconnected (${e.code}${e.reason ? ': ' + e.reason : ''}).`)
  ws.onerror = () => status('The terminal could not connect.')
  const input = term.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(d)) })
  const resized = term.onResize(({ cols, rows }) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }))
  })
  const onWindow = (): void => fit.fit()
  window.addEventListener('resize', onWindow)
  return () => {
    window.removeEventListener('resize', onWindow)
    input.dispose()
    resized.dispose()
    ws.close()
    term.dispose()
  }
}
