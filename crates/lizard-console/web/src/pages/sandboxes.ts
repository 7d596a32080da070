// Sandboxes: the live list (state, template, age, cost so far, end), create, pause,
// resume, kill and set the timeout.

import * as api from '../api'
import { age, attempt, h, options, replace, table, until, usd } from '../dom'
import type { Page } from '../page'

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

/** Most ids one `GET /v1/billing/sandboxes` takes (`lizard_api::MAX_COST_IDS`). */
const MAX_COST_IDS = 200

/** What each sandbox has cost so far (charged plus accrued since the last tick), as the
 * server sums it; any key may ask about its own sandboxes. */
async function costs(ids: string[]): Promise<Map<string, number>> {
  const total = new Map<string, number>()
  for (let i = 0; i < ids.length; i += MAX_COST_IDS) {
    const chunk = ids.slice(i, i + MAX_COST_IDS).join(',')
    const answer = await api.get<{ sandboxId: string, costNanos: number }[]>('/v1/billing/sandboxes' + api.q({ ids: chunk }))
    for (const c of answer) total.set(c.sandboxId, c.costNanos)
  }
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
  const listErrors = h('div', { id: 'sandbox-list-errors' })
  const list = h('div', { id: 'sandbox-list' }, h('p', { class: 'muted' }, 'Loading…'))
  const [templates, projects] = await Promise.all([api.get('/v1/templates'), api.get('/v1/projects')])
  const template = h('select', { name: 'template', id: 'create-template' },
    options(templates.filter((t: any) => t.ready).map((t: any) => ({ value: t.name, label: t.name })), 'base'))
  const project = h('select', { name: 'project', id: 'create-project' },
    options(projects.map((p: any) => ({ value: p.id, label: `${p.name} (${p.id})` }))))
  const minutes = h('input', { type: 'number', name: 'timeout', min: 1, value: 15, style: 'width:70px' })
  const refresh = async (): Promise<void> => {
    const sandboxes = await api.get<Sandbox[]>('/v1/sandboxes')
    const cost = await costs(sandboxes.map((s) => s.sandboxId))
    if (page.gone()) return
    replace(list, table(['Sandbox', 'State', 'Template', 'Age', 'Cost so far', 'Ends in', ''], sandboxes.map((s) => {
      const timeout = h('input', { type: 'number', min: 1, value: 15, title: 'minutes', style: 'width:56px' })
      const act = (fn: () => Promise<void>) => () => attempt(errors, async () => { await fn(); await refresh() })
      return [
        h('a', { href: `#/sandboxes/${api.enc(s.sandboxId)}`, class: 'mono' }, s.sandboxId),
        stateBadge(s.state),
        s.template,
        age(s.startedAt),
        usd(cost.get(s.sandboxId) ?? 0),
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
  // A failed load is shown above the list and tried again at the next tick, the first one
  // included: a passing fault must not leave the page at "Loading…". A refused key still
  // ends the page (the router signs it out).
  const reload = async (): Promise<void> => {
    try {
      await refresh()
      listErrors.replaceChildren()
    } catch (e) {
      if (e instanceof api.ApiError && e.status === 401) throw e
      if (!page.gone()) listErrors.replaceChildren(h('p', { class: 'error', role: 'alert' }, e instanceof Error ? e.message : String(e)))
    }
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
    errors, listErrors, list)
  await reload()
  page.every(3000, reload)
}
