// Templates (built-ins and the workspaces' pushed ones) and a template's latest build:
// its steps and log.

import * as api from '../api'
import { age, bytes, h, replace, table } from '../dom'
import type { Page } from '../page'

export async function templatesPage(page: Page): Promise<void> {
  const templates = await api.get('/v1/templates')
  replace(page.main, h('h1', {}, 'Templates'),
    h('p', { class: 'muted' }, 'Push your own with ', h('code', {}, 'lizard push'), '; built-ins are visible to every key.'),
    table(['Name', 'Kind', 'Ready', 'From', 'Own size', 'Updated', 'Description'], templates.map((t: any) => [
      h('a', { href: `#/templates/${api.enc(t.name)}` }, t.name),
      t.builtin ? 'built-in' : `pushed (${t.workspaceId ?? ''})`,
      t.ready ? 'yes' : 'no',
      t.from ?? '',
      t.sizeBytes !== undefined ? bytes(t.sizeBytes) : '',
      t.updatedAt ? age(t.updatedAt) + ' ago' : '',
      t.description,
    ])))
}

export async function templatePage(page: Page, name: string): Promise<void> {
  const t = await api.get(`/v1/templates/${api.enc(name)}`)
  const parts: (HTMLElement | string)[] = [
    h('h1', {}, t.name),
    h('p', {}, t.description || '', t.startCmd ? h('span', {}, ' · starts ', h('code', {}, t.startCmd)) : ''),
  ]
  if (!t.latestBuildId) {
    parts.push(h('p', { class: 'muted' }, t.builtin ? 'A built-in: built by the operator (lizard images build), no build log here.' : 'No build yet.'))
    replace(page.main, ...parts)
    return
  }
  const log = h('pre', { class: 'log', id: 'build-log' })
  const steps = h('div', {})
  const show = async (): Promise<void> => {
    const b = await api.get(`/v1/templates/${api.enc(name)}/builds/${api.enc(t.latestBuildId)}`)
    if (page.gone()) return
    replace(steps, h('p', {}, `Build ${b.buildId}: `, h('strong', {}, b.status), ` · started ${age(b.createdAt)} ago`,
      b.error ? h('span', { class: 'error' }, ` · ${b.error.code}: ${b.error.message}`) : ''),
    table(['#', 'Step', 'Cached', 'Took'], b.steps.map((s: any, i: number) => [
      String(i + 1), h('code', {}, s.description ?? ''), s.cached ? 'cached' : '', s.durationMs !== undefined ? `${(s.durationMs / 1000).toFixed(1)} s` : '',
    ])))
    log.textContent = b.log || '(no output)'
    log.scrollTop = log.scrollHeight
    if (b.status === 'running' || b.status === 'queued') page.every(2000, show)
  }
  parts.push(steps, h('h2', {}, 'Build log'), log)
  replace(page.main, ...parts)
  await show()
}
