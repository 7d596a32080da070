// Sandboxes: the live list (state, template, age, cost so far, end), create, pause,
// resume, kill and set the timeout.

import * as api from '../api'
import { age, attempt, h, options, replace, table, until, usd } from '../dom'
import type { Page } from '../main'

export interface Sandbox {
  sandboxId: string
  template: string
  state: string
  vcpus: number
  memoryMib: number
  startedAt: string
  endAt?: string
  projectId?: string
  domain?: string
  metadata?: Record<string, string>
}

/** What each sandbox has cost so far, for keys that may read the account's ledger. */
async function costs(page: Page): Promise<Map<string, number> | null> {
  if (page.who.scoped) return null
  const total = new Map<string, number>()
  const ledger = await api.get('/v1/billing/transactions' + api.q({ limit: 200, includeUsage: true }))
  for (const t of ledger.items) if (t.sandboxId) total.set(t.sandboxId, (total.get(t.sandboxId) ?? 0) - t.amountNanos)
  const live = await api.get('/v1/billing/live')
  for (const s of live.sandboxes) total.set(s.sandboxId, (total.get(s.sandboxId) ?? 0) + s.unbilledNanos)
  return total
}

export function stateBadge(state: string): HTMLElement {
  return h('span', { class: `state ${state}` }, state)
}

export async function pause(id: string): Promise<void> { await api.call('POST', `/v1/sandboxes/${api.enc(id)}/pause`) }
export async function resume(id: string): Promise<void> { await api.call('POST', `/v1/sandboxes/${api.enc(id)}/resume`) }
export async function kill(id: string): Promise<void> { await api.call('DELETE', `/v1/sandboxes/${api.enc(id)}`) }
export async function setTimeoutMinutes(id: string, minutes: number): Promise<void> {
  await api.call('POST', `/v1/sandboxes/${api.enc(id)}/timeout`, { timeoutMs: Math.round(minutes * 60_000) })
}

export async function sandboxesPage(page: Page): Promise<void> {
  const errors = h('div', {})
  const list = h('div', { id: 'sandbox-list' }, h('p', { class: 'muted' }, 'Loading…'))
  const [templates, projects] = await Promise.all([api.get('/v1/templates'), api.get('/v1/projects')])
  const template = h('select', { name: 'template', id: 'create-template' },
    options(templates.filter((t: any) => t.ready).map((t: any) => ({ value: t.name, label: t.name })), 'base'))
  const project = h('select', { name: 'project', id: 'create-project' },
    options(projects.map((p: any) => ({ value: p.id, label: `${p.name} (${p.id})` }))))
  const minutes = h('input', { type: 'number', name: 'timeout', min: 1, value: 15, style: 'width:70px' })
  const refresh = async (): Promise<void> => {
    const [sandboxes, cost] = await Promise.all([api.get<Sandbox[]>('/v1/sandboxes'), costs(page)])
    if (page.gone()) return
    replace(list, table(['Sandbox', 'State', 'Template', 'Age', 'Cost so far', 'Ends in', ''], sandboxes.map((s) => {
      const timeout = h('input', { type: 'number', min: 1, value: 15, title: 'minutes', style: 'width:56px' })
      const act = (fn: () => Promise<void>) => () => attempt(errors, async () => { await fn(); await refresh() })
      return [
        h('a', { href: `#/sandboxes/${api.enc(s.sandboxId)}`, class: 'mono' }, s.sandboxId),
        stateBadge(s.state),
        s.template,
        age(s.startedAt),
        cost ? usd(cost.get(s.sandboxId) ?? 0) : h('span', { class: 'muted', title: 'the ledger needs an unscoped key' }, '—'),
        until(s.endAt),
        h('span', { class: 'actions' },
          s.state === 'running'
            ? h('button', { onclick: act(() => pause(s.sandboxId)) }, 'Pause')
            : h('button', { onclick: act(() => resume(s.sandboxId)) }, 'Resume'),
          ' ', timeout, h('button', { onclick: act(() => setTimeoutMinutes(s.sandboxId, Number((timeout as HTMLInputElement).value))) }, 'Set timeout'),
          ' ', h('button', { class: 'danger', onclick: act(() => kill(s.sandboxId)) }, 'Kill')),
      ]
    }), 'No sandboxes running.'))
  }
  const create = h('form', {
    class: 'inline',
    id: 'create-sandbox',
    onsubmit: (e: Event) => {
      e.preventDefault()
      void attempt(errors, async () => {
        const button = create.querySelector('button') as HTMLButtonElement
        button.disabled = true
        button.textContent = 'Creating…'
        try {
          const s = await api.call<Sandbox>('POST', '/v1/sandboxes', {
            template: (template as HTMLSelectElement).value,
            projectId: (project as HTMLSelectElement).value,
            timeoutMs: Math.round(Number((minutes as HTMLInputElement).value) * 60_000),
          })
          location.hash = `#/sandboxes/${api.enc(s.sandboxId)}`
        } finally {
          button.disabled = false
          button.textContent = 'Create'
        }
      })
    },
  }, 'Template', template, 'Project', project, 'Timeout (min)', minutes, h('button', { class: 'primary', type: 'submit' }, 'Create'))
  replace(page.main, h('h1', {}, 'Sandboxes'),
    projects.length ? create : h('p', { class: 'muted' }, 'This key reaches no project to create sandboxes in.'),
    errors, list)
  await refresh()
  page.every(3000, refresh)
}
