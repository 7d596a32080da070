// A few DOM helpers: elements are built with h(), never from HTML strings, so nothing the
// API returns is ever parsed as markup.

type Attrs = Record<string, string | number | boolean | ((e: Event) => void) | undefined>
type Child = Node | string | number | null | undefined | false | Child[]

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue
    if (typeof v === 'function') el.addEventListener(k.replace(/^on/, ''), v)
    // Through the CSSOM: the CSP allows no inline style attributes.
    else if (k === 'style') el.style.cssText = String(v)
    else if (v === true) el.setAttribute(k, '')
    else el.setAttribute(k, String(v))
  }
  append(el, children)
  return el
}

function append(el: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue
    if (Array.isArray(c)) append(el, c)
    else el.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)))
  }
}

export function replace(el: Element, ...children: Child[]): void {
  el.replaceChildren()
  append(el, children)
}

export function table(headers: string[], rows: Child[][], empty = 'Nothing here yet.'): HTMLElement {
  if (rows.length === 0) return h('p', { class: 'muted' }, empty)
  return h('table', {},
    h('thead', {}, h('tr', {}, headers.map((t) => h('th', {}, t)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c))))))
}

function duration(s: number): string {
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`
}

/** How long ago `rfc3339` was. */
export function age(rfc3339: string | undefined): string {
  return rfc3339 ? duration(Math.max(0, Math.round((Date.now() - Date.parse(rfc3339)) / 1000))) : ''
}

/** How long until `rfc3339`. */
export function until(rfc3339: string | undefined): string {
  return rfc3339 ? duration(Math.max(0, Math.round((Date.parse(rfc3339) - Date.now()) / 1000))) : ''
}

export function usd(nanos: number): string {
  const d = nanos / 1e9
  return `$${d < 0.01 && d > 0 ? d.toFixed(6) : d.toFixed(2)}`
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`
  const units = ['KiB', 'MiB', 'GiB', 'TiB']
  let v = n
  let u = -1
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++ }
  return `${v.toFixed(1)} ${units[u]}`
}

/** Run `fn`, showing what failed in `box` (cleared first). */
export async function attempt(box: HTMLElement, fn: () => Promise<void>): Promise<void> {
  box.replaceChildren()
  try {
    await fn()
  } catch (e) {
    box.replaceChildren(h('p', { class: 'error', role: 'alert' }, e instanceof Error ? e.message : String(e)))
  }
}

export function options(items: { value: string; label: string }[], selected?: string): HTMLOptionElement[] {
  return items.map((i) => h('option', { value: i.value, selected: i.value === selected }, i.label))
}
