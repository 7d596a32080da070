// The console's shell: sign-in, the header, and hash routes to the pages. Every page is a
// function that fills `main` and may register a refresh (stopped when the page changes).

import * as api from './api'
import { h, replace } from './dom'
import { sandboxesPage } from './pages/sandboxes'
import { sandboxPage } from './pages/sandbox'
import { templatesPage, templatePage } from './pages/templates'
import { volumesPage } from './pages/volumes'
import { keysPage } from './pages/keys'
import { usagePage } from './pages/usage'
import type { Page, Who } from './page'

const app = document.getElementById('app') as HTMLElement
let generation = 0
let who: Who | null = null

const NAV: [string, string][] = [
  ['#/sandboxes', 'Sandboxes'],
  ['#/templates', 'Templates'],
  ['#/volumes', 'Volumes'],
  ['#/keys', 'API keys'],
  ['#/usage', 'Usage'],
]

function signInPage(error?: string): void {
  generation++
  const input = h('input', { type: 'password', id: 'api-key', placeholder: 'lz_…', autocomplete: 'off', spellcheck: 'false' })
  const form = h('form', {
    class: 'card signin',
    onsubmit: async (e: Event) => {
      e.preventDefault()
      api.signIn((input as HTMLInputElement).value.trim())
      try {
        who = await api.get<Who>('/v1/whoami')
        if (!location.hash || location.hash === '#/signin') location.hash = '#/sandboxes'
        route()
      } catch (err) {
        api.signOut()
        signInPage(err instanceof api.ApiError && err.status === 401 ? 'That key was not accepted.' : String(err))
      }
    },
  },
  h('h1', {}, 'Lizard console'),
  h('p', { class: 'muted' }, 'Sign in with an API key. It is kept in this tab only (session storage) and sent to this server\'s API with each request; what you see is what the key may see.'),
  input,
  error ? h('p', { class: 'error', role: 'alert' }, error) : null,
  h('button', { class: 'primary', type: 'submit' }, 'Sign in'))
  replace(app, form)
  ;(input as HTMLInputElement).focus()
}

function shell(active: string): HTMLElement {
  const main = h('main', {})
  const scope = who?.scoped ? `scoped key “${who.keyName}”` : `${who?.email ?? ''} (${who?.keyName})`
  replace(app,
    h('header', {},
      h('span', { class: 'brand' }, 'Lizard'),
      h('nav', {}, NAV.map(([href, label]) => h('a', { href, class: active === href ? 'active' : undefined }, label))),
      h('span', { class: 'who', id: 'who' }, scope),
      h('button', { id: 'sign-out', onclick: () => { api.signOut(); who = null; location.hash = '#/signin'; signInPage() } }, 'Sign out')),
    main)
  return main
}

async function route(): Promise<void> {
  if (!api.key()) return signInPage()
  if (!who) {
    try {
      who = await api.get<Who>('/v1/whoami')
    } catch {
      api.signOut()
      return signInPage('Your key was not accepted any more; sign in again.')
    }
  }
  const mine = ++generation
  // `#/page/ID?name=value`: the path picks the page, the query is the page's own state.
  const [path, query] = location.hash.replace(/^#\/?/, '').split('?', 2)
  const parts = (path || 'sandboxes').split('/').map(decodeURIComponent)
  const params = new URLSearchParams(query ?? '')
  const timers: number[] = []
  const gone = (): boolean => mine !== generation
  const page: Page = {
    main: shell('#/' + parts[0]),
    who,
    gone,
    every(ms, fn) {
      const tick = async (): Promise<void> => {
        if (gone()) return
        try { await fn() } catch (e) { console.warn(e) }
        if (!gone()) timers.push(window.setTimeout(tick, ms))
      }
      timers.push(window.setTimeout(tick, ms))
    },
  }
  window.addEventListener('hashchange', () => timers.forEach(clearTimeout), { once: true })
  try {
    switch (parts[0]) {
      case 'sandboxes': return parts[1] ? await sandboxPage(page, parts[1], params) : await sandboxesPage(page)
      case 'templates': return parts[1] ? await templatePage(page, parts[1]) : await templatesPage(page)
      case 'volumes': return await volumesPage(page)
      case 'keys': return await keysPage(page)
      case 'usage': return await usagePage(page)
      default: location.hash = '#/sandboxes'
    }
  } catch (e) {
    if (e instanceof api.ApiError && e.status === 401) {
      api.signOut()
      who = null
      return signInPage('Your key was not accepted any more; sign in again.')
    }
    if (!gone()) page.main.append(h('p', { class: 'error', role: 'alert' }, String(e instanceof Error ? e.message : e)))
  }
}

window.addEventListener('hashchange', () => { void route() })
void route()
