// The public API with the signed-in key. The key lives in sessionStorage only (gone when
// the tab closes) and travels in the X-API-Key header — never in a URL or a cookie.

const KEY = 'lizard.apiKey'

export class ApiError extends Error {
  constructor(readonly status: number, readonly code: string, message: string) {
    super(`${code}: ${message}`)
  }
}

export function key(): string | null {
  return sessionStorage.getItem(KEY)
}

export function signIn(k: string): void {
  sessionStorage.setItem(KEY, k)
}

export function signOut(): void {
  sessionStorage.removeItem(KEY)
}

async function send(method: string, path: string, body?: BodyInit | object, headers: Record<string, string> = {}): Promise<Response> {
  const k = key()
  if (!k) throw new ApiError(401, 'UNAUTHENTICATED', 'not signed in')
  const h: Record<string, string> = { 'X-API-Key': k, ...headers }
  let payload: BodyInit | undefined
  if (body instanceof Blob || body instanceof ArrayBuffer || typeof body === 'string') payload = body
  else if (body !== undefined) {
    payload = JSON.stringify(body)
    h['Content-Type'] = 'application/json'
  }
  const resp = await fetch(path, { method, headers: h, body: payload, credentials: 'omit', cache: 'no-store' })
  if (!resp.ok) {
    let code = 'HTTP_' + resp.status
    let message = resp.statusText
    try {
      const e = await resp.json()
      code = e.code ?? code
      message = e.message ?? message
    } catch { /* not JSON */ }
    throw new ApiError(resp.status, code, message)
  }
  return resp
}

export async function call<T = any>(method: string, path: string, body?: object): Promise<T> {
  const resp = await send(method, path, body)
  if (resp.status === 204) return undefined as T
  return resp.json() as Promise<T>
}

export const get = <T = any>(path: string): Promise<T> => call<T>('GET', path)

export async function download(path: string): Promise<Blob> {
  return (await send('GET', path)).blob()
}

export async function upload(path: string, data: Blob): Promise<void> {
  await send('PUT', path, data, { 'Content-Type': 'application/octet-stream' })
}

export function q(params: Record<string, string | number | boolean | undefined>): string {
  const s = new URLSearchParams()
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') s.set(k, String(v))
  const t = s.toString()
  return t ? `?${t}` : ''
}

export const enc = encodeURIComponent
