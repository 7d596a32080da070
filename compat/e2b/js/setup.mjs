// What the E2B npm tests share: the server scripts/test-sdk.sh started, and per test file
// a workspace, project and project-scoped key of its own, set as E2B's variables.
import { randomBytes } from 'node:crypto'

export const API_URL = process.env.LIZARD_SDK_TEST_API_URL
export const SANDBOX_URL = `http://${process.env.LIZARD_SDK_TEST_PROXY}`
const OWNER_KEY = process.env.LIZARD_SDK_TEST_API_KEY

/** A call to Lizard's own API with the owner's key: its JSON answer (null for 204). */
export async function lizard(method, path, body) {
  const res = await fetch(API_URL + path, {
    method,
    headers: { 'X-API-Key': OWNER_KEY, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  return res.status === 204 ? null : res.json()
}

/** A new workspace and project, a key scoped to the project set as E2B_API_KEY (in E2B's
 * `e2b_` + hex form, which some SDK versions insist on), and E2B_API_URL/E2B_SANDBOX_URL:
 * the workspace, for `forgetE2bEnv`. */
export async function scopedE2bEnv(name) {
  const suffix = randomBytes(4).toString('hex')
  const workspace = await lizard('POST', '/v1/workspaces', { name: `${name}-${suffix}` })
  const project = await lizard('POST', '/v1/projects', { workspaceId: workspace.id, name: `${name}-${suffix}` })
  const key = await lizard('POST', '/v1/api-keys', { name: `${name}-${suffix}`, projects: [project.id] })
  process.env.E2B_API_URL = API_URL
  process.env.E2B_SANDBOX_URL = SANDBOX_URL
  process.env.E2B_API_KEY = 'e2b_' + Buffer.from(key.key).toString('hex')
  return workspace
}

/** Delete what `scopedE2bEnv` made, sandboxes included. */
export async function forgetE2bEnv(workspace) {
  await lizard('DELETE', `/v1/workspaces/${workspace.id}?force=true`)
}
