// API keys: list, create (the key is shown once, here), delete. Scoped keys may be limited
// to workspaces or projects.

import * as api from '../api'
import { age, attempt, h, options, replace, table } from '../dom'
import type { Page } from '../page'

export async function keysPage(page: Page): Promise<void> {
  const errors = h('div', {})
  const shown = h('div', { id: 'new-key' })
  const list = h('div', { id: 'key-list' })
  const workspaces = await api.get('/v1/workspaces')
  const refresh = async (): Promise<void> => {
    const keys = await api.get('/v1/api-keys')
    replace(list, table(['Name', 'Prefix', 'Scope', 'Created', ''], keys.map((k: any) => [
      k.name,
      h('span', { class: 'mono' }, k.prefix),
      k.workspaces || k.projects ? [...(k.workspaces ?? []).map((w: string) => `workspace ${w}`), ...(k.projects ?? []).map((p: string) => `project ${p}`)].join(', ') : 'unscoped',
      age(k.createdAt) + ' ago',
      k.id === page.who.keyId ? h('span', { class: 'muted' }, 'this key') : h('button', { class: 'danger', onclick: () => attempt(errors, async () => {
        await api.call('DELETE', `/v1/api-keys/${api.enc(k.id)}`)
        await refresh()
      }) }, 'Delete'),
    ])))
  }
  const name = h('input', { name: 'name', id: 'key-name', placeholder: 'name', required: true }) as HTMLInputElement
  const scope = h('select', { name: 'workspace', id: 'key-workspace' },
    page.who.scoped ? [] : h('option', { value: '' }, 'unscoped (the whole account)'),
    options(workspaces.map((w: any) => ({ value: w.id, label: `workspace ${w.name}` })))) as HTMLSelectElement
  const create = h('form', {
    class: 'inline',
    onsubmit: (e: Event) => {
      e.preventDefault()
      void attempt(errors, async () => {
        const made = await api.call('POST', '/v1/api-keys', { name: name.value, ...(scope.value ? { workspaces: [scope.value] } : {}) })
        name.value = ''
        replace(shown, h('div', { class: 'card' },
          h('p', {}, h('strong', {}, `Key “${made.name}” created.`), ' Copy it now: it is shown once, and only its hash is kept.'),
          h('div', { class: 'secret', id: 'new-key-value' }, made.key)))
        await refresh()
      })
    },
  }, 'Name', name, 'Scope', scope, h('button', { class: 'primary', type: 'submit' }, 'Create key'))
  replace(page.main, h('h1', {}, 'API keys'), create, errors, shown, list)
  await refresh()
}
