// What a page is given: where to draw, who is signed in, and a refresh that runs while
// it is shown. The shell (main.ts) makes one per route.

export interface Who {
  accountId: string
  keyId: string
  keyName: string
  scoped: boolean
  email?: string
  workspaces?: string[]
  projects?: string[]
}

export interface Page {
  main: HTMLElement
  who: Who
  /** Run `fn` every `ms` while this page is shown. */
  every(ms: number, fn: () => Promise<void>): void
  /** Whether the user has left this page. */
  gone(): boolean
}
