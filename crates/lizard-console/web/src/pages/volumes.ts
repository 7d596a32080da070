// Volumes: list, create, delete.

import * as api from '../api'
import { age, attempt, h, options, replace, table } from '../dom'
import type { Page } from '../page'

export async function volumesPage(page: Page): Promise<void> {
  const errors = h('div', {})
  const list = h('div', { id: 'volume-list' })
  const projects = await api.get('/v1/projects')
  const refresh = async (): Promise<void> => {
    const volumes = await api.get('/v1/volumes')
    replace(list, table(['Name', 'Id', 'Project', 'Size', 'Region', 'Mounted by', 'Created', ''], volumes.map((v: any) => [
      v.name, h('span', { class: 'mono' }, v.id), v.projectId, `${v.sizeGb} GB`, v.region,
      v.attachedTo ? h('a', { href: `#/sandboxes/${api.enc(v.attachedTo)}`, class: 'mono' }, v.attachedTo) : '',
      age(v.createdAt) + ' ago',
      h('button', { class: 'danger', onclick: () => attempt(errors, async () => {
        await api.call('DELETE', `/v1/volumes/${api.enc(v.id)}`)
        await refresh()
      }) }, 'Delete'),
    ]), 'No volumes.'))
  }
  const name = h('input', { name: 'name', placeholder: 'name', required: true }) as HTMLInputElement
  const project = h('select', { name: 'project' }, options(projects.map((p: any) => ({ value: p.id, label: p.name })))) as HTMLSelectElement
  const size = h('input', { type: 'number', name: 'sizeGb', min: 1, max: 1024, value: 1, style: 'width:70px' }) as HTMLInputElement
  const create = h('form', {
    class: 'inline',
    onsubmit: (e: Event) => {
      e.preventDefault()
      void attempt(errors, async () => {
        await api.call('POST', '/v1/volumes', { name: name.value, projectId: project.value, sizeGb: Number(size.value) })
        name.value = ''
        await refresh()
      })
    },
  }, 'Name', name, 'Project', project, 'Size (GB)', size, h('button', { class: 'primary', type: 'submit' }, 'Create volume'))
  replace(page.main, h('h1', {}, 'Volumes'), projects.length ? create : '', errors, list)
  await refresh()
}
