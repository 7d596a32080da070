// Usage within the key's scope (sandbox time and cost per workspace and project, as bars),
// and for unscoped keys the account's balance, burn rate and ledger.

import * as api from '../api'
import { age, h, replace, table, usd } from '../dom'
import type { Page } from '../page'

function bars(rows: { label: string; value: number; text: string }[], empty: string): HTMLElement {
  const max = Math.max(1, ...rows.map((r) => r.value))
  if (!rows.length) return h('p', { class: 'muted' }, empty)
  return h('div', { class: 'bars' }, rows.map((r) =>
    h('div', { class: 'bar' }, h('span', { class: 'mono' }, r.label),
      h('div', {}, h('div', { class: 'fill', style: `width:${(100 * r.value) / max}%` })), h('span', {}, r.text))))
}

export async function usagePage(page: Page): Promise<void> {
  const m = await api.get('/v1/metrics')
  const per = [...m.workspaces.map((u: any) => ({ ...u, label: `workspace ${u.workspaceId}` })),
    ...m.projects.map((u: any) => ({ ...u, label: `project ${u.projectId}` }))]
  const parts: (HTMLElement | string)[] = [
    h('h1', {}, 'Usage'),
    h('div', { class: 'grid2' },
      h('div', { class: 'card', id: 'usage-cost' }, h('h2', {}, 'Cost'),
        bars(per.map((u: any) => ({ label: u.label, value: u.costNanos, text: usd(u.costNanos) })), 'No usage yet.')),
      h('div', { class: 'card', id: 'usage-time' }, h('h2', {}, 'Sandbox time'),
        bars(per.map((u: any) => ({ label: u.label, value: u.sandboxMs, text: `${u.sandboxSeconds} s` })), 'No usage yet.'))),
  ]
  if (!page.who.scoped) {
    const [balance, live, ledger] = await Promise.all([
      api.get('/v1/billing/balance'), api.get('/v1/billing/live'), api.get('/v1/billing/transactions' + api.q({ limit: 25 })),
    ])
    parts.push(
      h('div', { class: 'card', id: 'balance' }, h('h2', {}, 'Balance'),
        h('p', {}, h('strong', {}, `$${balance.balance}`), ` · burning $${live.burnPerHour}/hour on ${live.sandboxes.length} sandboxes`,
          balance.depletedSince ? h('span', { class: 'error' }, ` · at zero since ${balance.depletedSince}`) : '')),
      h('h2', {}, 'Transactions'),
      table(['When', 'Kind', 'Amount', 'Description'], ledger.items.map((t: any) => [
        age(t.createdAt) + ' ago', t.kind, `$${t.amount}`, t.description,
      ]), 'No transactions.'))
  } else {
    parts.push(h('p', { class: 'muted' }, 'Balance and transactions belong to the account: an unscoped key sees them.'))
  }
  replace(page.main, ...parts)
}
