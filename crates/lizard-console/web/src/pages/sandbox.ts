// One sandbox: its facts and actions, a live terminal (reattached after a reload), a file
// browser (list, download, upload) and its open ports as links to its URLs.

import * as api from '../api'
import { age, attempt, bytes, h, replace, table, until } from '../dom'
import type { Page } from '../page'
import { openTerminal } from '../terminal'
import { kill, pause, resume, Sandbox, stateBadge } from './sandboxes'

interface Settings { sandboxUrlPort?: number | null }

/** Closes the terminal the page shows: before the page is drawn again (Pause, Resume)
 * or left, so no socket stays open behind it. */
let closeTerminal = (_hangUp?: boolean): void => {}

/** A TCP port something listens on in the guest (`GET /v1/sandboxes/{id}/ports`; the
 * platform's own ports are never listed). */
interface ListeningPort { port: number, address: string, pid?: number, cmd?: string }

function filesCard(id: string, errors: HTMLElement): HTMLElement {
  const listing = h('div', { id: 'file-list' })
  const path = h('input', { id: 'file-path', value: '/root', style: 'width:320px' }) as HTMLInputElement
  const base = `/v1/sandboxes/${api.enc(id)}/files`
  // Listings can overlap (the first one still loading when the user lists another
  // directory): only the latest one asked for is drawn.
  let latest = 0
  const show = async (dir: string): Promise<void> => {
    const asked = ++latest
    path.value = dir
    const entries = await api.get(`${base}/list` + api.q({ path: dir }))
    if (asked !== latest) return
    const parent = dir.replace(/\/[^/]+\/?$/, '') || '/'
    replace(listing, table(['Name', 'Size', 'Modified', ''], [
      ...(dir !== '/' ? [[h('a', { href: '#', onclick: (e: Event) => { e.preventDefault(); void attempt(errors, () => show(parent)) } }, '..'), '', '', '']] : []),
      ...entries.map((e: any) => [
        e.type === 'dir'
          ? h('a', { href: '#', onclick: (ev: Event) => { ev.preventDefault(); void attempt(errors, () => show(e.path)) } }, e.name + '/')
          : h('span', { class: 'mono' }, e.name),
        e.type === 'dir' ? '' : bytes(e.size),
        age(new Date(e.mtimeMs).toISOString()) + ' ago',
        e.type === 'file'
          ? h('button', { onclick: () => attempt(errors, async () => {
            const blob = await api.download(base + api.q({ path: e.path }))
            const a = h('a', { href: URL.createObjectURL(blob), download: e.name })
            a.click()
            setTimeout(() => URL.revokeObjectURL(a.href), 10_000)
          }) }, 'Download')
          : '',
      ]),
    ], 'Empty directory.'))
  }
  const chooser = h('input', { type: 'file', id: 'upload-file', multiple: true }) as HTMLInputElement
  const uploadForm = h('form', {
    class: 'inline',
    onsubmit: (e: Event) => {
      e.preventDefault()
      void attempt(errors, async () => {
        const dir = path.value.replace(/\/$/, '')
        for (const f of Array.from(chooser.files ?? [])) await api.upload(base + api.q({ path: `${dir}/${f.name}` }), f)
        chooser.value = ''
        await show(path.value)
      })
    },
  }, chooser, h('button', { type: 'submit' }, 'Upload here'))
  const go = h('form', { class: 'inline', onsubmit: (e: Event) => { e.preventDefault(); void attempt(errors, () => show(path.value)) } },
    'Path', path, h('button', { type: 'submit' }, 'List'))
  void attempt(errors, () => show(path.value))
  return h('div', { class: 'card' }, h('h2', {}, 'Files'), go, listing, uploadForm)
}

function portsCard(s: Sandbox, settings: Settings, errors: HTMLElement): HTMLElement {
  const list = h('div', { id: 'port-list' }, h('p', { class: 'muted' }, 'Looking for listening ports…'))
  const scan = async (): Promise<void> => {
    const ports = await api.get<ListeningPort[]>(`/v1/sandboxes/${api.enc(s.sandboxId)}/ports`)
    const link = (p: number): HTMLElement => {
      if (!s.domain || !settings.sandboxUrlPort) return h('span', { class: 'mono' }, String(p))
      const url = `${location.protocol}//${s.sandboxId}-${p}.${s.domain}:${settings.sandboxUrlPort}/`
      return h('a', { href: url, target: '_blank', rel: 'noopener noreferrer', class: 'mono' }, url)
    }
    // A sandbox URL reaches the port on any address it listens on: one link per port.
    const byPort = new Map<number, ListeningPort[]>()
    for (const p of ports) byPort.set(p.port, [...(byPort.get(p.port) ?? []), p])
    replace(list, byPort.size
      ? table(['Port', 'Address', 'Process', 'Sandbox URL'], [...byPort].map(([port, on]) => [
        h('span', { class: 'mono' }, String(port)),
        h('span', { class: 'mono' }, on.map((p) => p.address).join(', ')),
        h('span', { class: 'mono' }, on[0].pid !== undefined ? `${on[0].pid} ${on[0].cmd ?? ''}` : ''),
        link(port),
      ]))
      : h('p', { class: 'muted' }, 'Nothing listens on a TCP port.'))
  }
  void attempt(errors, scan)
  return h('div', { class: 'card' }, h('h2', {}, 'Open ports'), list, h('button', { onclick: () => attempt(errors, scan) }, 'Scan again'))
}

/** The sandbox page's address; with `pid`, the shell its terminal reattaches to. */
function sandboxHash(id: string, pid?: number): string {
  return `#/sandboxes/${api.enc(id)}` + (pid === undefined ? '' : api.q({ pid }))
}

/** The page's query as it stands now (the terminal writes its shell's pid there). */
function currentParams(): URLSearchParams {
  return new URLSearchParams(location.hash.split('?', 2)[1] ?? '')
}

interface ProcessInfo { pid: number, pty: boolean, exitCode?: number }

/** The terminal card: a new shell, or with `?pid=` the shell a reload or another tab left
 * running, its kept output replayed. `open` connects it, once the card is on the page
 * (xterm.js sizes itself to what it is shown in). */
async function terminalCard(page: Page, id: string, params: URLSearchParams): Promise<{ card: HTMLElement, open: () => void }> {
  const term = h('div', { id: 'terminal' })
  const termStatus = h('p', { class: 'muted', id: 'terminal-status' }, 'Connecting…')
  const newShell = h('button', {
    id: 'new-shell',
    hidden: true,
    onclick: () => {
      closeTerminal(true)
      history.replaceState(history.state, '', sandboxHash(id))
      void sandboxPage(page, id, new URLSearchParams())
    },
  }, 'New shell')
  const card = h('div', { class: 'card' }, h('h2', {}, 'Terminal'), term, h('div', { class: 'inline' }, termStatus, newShell))
  const asked = params.get('pid')
  const pid = asked !== null && /^\d+$/.test(asked) ? Number(asked) : undefined
  if (asked !== null) {
    const shell = pid === undefined
      ? undefined
      : (await api.get<ProcessInfo[]>(`/v1/sandboxes/${api.enc(id)}/processes`)).find((p) => p.pid === pid && p.pty)
    if (!shell) {
      termStatus.textContent = `There is no shell ${asked} in this sandbox any more (it ended before the sandbox restarted, or never ran here).`
      newShell.hidden = false
      return { card, open: () => {} }
    }
  }
  const open = (): void => {
    closeTerminal = openTerminal(term, id, pid, {
      status: (s) => { termStatus.textContent = s },
      started: (started) => {
        if (started !== pid && !page.gone()) history.replaceState(history.state, '', sandboxHash(id, started))
      },
      ended: () => { newShell.hidden = false },
    })
  }
  return { card, open }
}

export async function sandboxPage(page: Page, id: string, params: URLSearchParams): Promise<void> {
  closeTerminal()
  const [s, settings] = await Promise.all([
    api.get<Sandbox>(`/v1/sandboxes/${api.enc(id)}`),
    fetch('/console/settings.json').then((r) => r.json() as Promise<Settings>),
  ])
  const errors = h('div', {})
  const act = (fn: () => Promise<void>, then: () => void) => () => attempt(errors, async () => { await fn(); then() })
  const reload = (): void => { void sandboxPage(page, id, currentParams()) }
  const facts = h('div', { class: 'card', id: 'sandbox-facts' },
    h('h1', {}, h('span', { class: 'mono' }, s.sandboxId), ' ', stateBadge(s.state)),
    h('p', {}, `Template ${s.template} · ${s.vcpus} vCPU · ${s.memoryMib} MiB · started ${age(s.startedAt)} ago`,
      s.endAt ? ` · ends in ${until(s.endAt)}` : '', s.projectId ? ` · project ${s.projectId}` : ''),
    s.state === 'running'
      ? h('button', { onclick: act(() => pause(id), reload) }, 'Pause')
      : h('button', { onclick: act(() => resume(id), reload) }, 'Resume'),
    ' ', h('button', { class: 'danger', id: 'kill', onclick: act(() => kill(id), () => { location.hash = '#/sandboxes' }) }, 'Kill'))
  if (s.state !== 'running') {
    replace(page.main, facts, errors, h('p', { class: 'muted' }, 'Resume the sandbox to use its terminal, files and ports.'))
    return
  }
  const terminal = await terminalCard(page, id, params)
  replace(page.main, facts, errors, terminal.card,
    h('div', { class: 'grid2' }, filesCard(id, errors), portsCard(s, settings, errors)))
  terminal.open()
  // Leaving the page ends its shell, as closing a terminal window does (a reload does not).
  window.addEventListener('hashchange', () => closeTerminal(true), { once: true })
}
