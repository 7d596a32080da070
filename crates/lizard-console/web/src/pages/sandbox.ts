// One sandbox: its facts and actions, a live terminal, a file browser (list, download,
// upload) and its open ports as links to its URLs.

import * as api from '../api'
import { age, attempt, bytes, h, replace, table, until } from '../dom'
import type { Page } from '../main'
import { openTerminal } from '../terminal'
import { kill, pause, resume, Sandbox, stateBadge } from './sandboxes'

/** Lizard's own guest ports: never a user's service, never routed by sandbox URLs. */
const RESERVED_PORTS = new Set([49171, 49999])

interface Settings { sandboxUrlPort?: number | null }

/** Closes the terminal the page shows: before the page is drawn again (Pause, Resume)
 * or left, so no socket stays open behind it. */
let closeTerminal = (): void => {}

/** The TCP ports something listens on in the guest, from /proc/net/tcp{,6}. */
export async function listeningPorts(id: string): Promise<number[]> {
  const r = await api.call('POST', `/v1/sandboxes/${api.enc(id)}/exec`, { cmd: 'cat /proc/net/tcp /proc/net/tcp6 2>/dev/null', timeoutMs: 10_000 })
  const ports = new Set<number>()
  for (const line of String(r.stdout).split('\n')) {
    const f = line.trim().split(/\s+/)
    // sl local_address rem_address st …; st 0A is LISTEN.
    if (f.length > 3 && f[3] === '0A') {
      const port = parseInt(f[1].split(':')[1], 16)
      if (port && !RESERVED_PORTS.has(port)) ports.add(port)
    }
  }
  return [...ports].sort((a, b) => a - b)
}

function filesCard(id: string, errors: HTMLElement): HTMLElement {
  const listing = h('div', { id: 'file-list' })
  const path = h('input', { id: 'file-path', value: '/root', style: 'width:320px' }) as HTMLInputElement
  const base = `/v1/sandboxes/${api.enc(id)}/files`
  const show = async (dir: string): Promise<void> => {
    path.value = dir
    const entries = await api.get(`${base}/list` + api.q({ path: dir }))
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
    const ports = await listeningPorts(s.sandboxId)
    const link = (p: number): HTMLElement => {
      if (!s.domain || !settings.sandboxUrlPort) return h('span', { class: 'mono' }, String(p))
      const url = `${location.protocol}//${s.sandboxId}-${p}.${s.domain}:${settings.sandboxUrlPort}/`
      return h('a', { href: url, target: '_blank', rel: 'noopener noreferrer', class: 'mono' }, url)
    }
    replace(list, ports.length ? h('ul', {}, ports.map((p) => h('li', {}, `${p}: `, link(p)))) : h('p', { class: 'muted' }, 'Nothing listens on a TCP port.'))
  }
  void attempt(errors, scan)
  return h('div', { class: 'card' }, h('h2', {}, 'Open ports'), list, h('button', { onclick: () => attempt(errors, scan) }, 'Scan again'))
}

export async function sandboxPage(page: Page, id: string): Promise<void> {
  closeTerminal()
  const [s, settings] = await Promise.all([
    api.get<Sandbox>(`/v1/sandboxes/${api.enc(id)}`),
    fetch('/console/settings.json').then((r) => r.json() as Promise<Settings>),
  ])
  const errors = h('div', {})
  const act = (fn: () => Promise<void>, then: () => void) => () => attempt(errors, async () => { await fn(); then() })
  const reload = (): void => { void sandboxPage(page, id) }
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
  const term = h('div', { id: 'terminal' })
  const termStatus = h('p', { class: 'muted', id: 'terminal-status' }, 'Connecting…')
  replace(page.main, facts, errors,
    h('div', { class: 'card' }, h('h2', {}, 'Terminal'), term, termStatus),
    h('div', { class: 'grid2' }, filesCard(id, errors), portsCard(s, settings, errors)))
  closeTerminal = openTerminal(term, id, (status) => { termStatus.textContent = status })
  window.addEventListener('hashchange', () => closeTerminal(), { once: true })
}
