//! Sandbox access rules.

use crate::harness::TestDb;
use crate::store_tests;
use crate::SandboxAccess;

async fn access_rules_are_kept_hashed_and_copied_to_forks(db: TestDb) {
    let s = db.open().await;
    assert_eq!(s.sandbox_access("a").await.unwrap(), None);
    let private = SandboxAccess { token_hash: vec![1, 2, 3], urls_public: false, resume_on_request: false };
    s.set_sandbox_access("a", &private).await.unwrap();
    assert_eq!(s.sandbox_access("a").await.unwrap(), Some(private.clone()));
    s.copy_sandbox_access("a", "b").await.unwrap();
    assert_eq!(s.sandbox_access("b").await.unwrap(), Some(private));
    // A token with public URLs that resume the sandbox (an E2B sandbox's) is copied whole.
    let e2b = SandboxAccess { token_hash: vec![4], urls_public: true, resume_on_request: true };
    s.set_sandbox_access("e", &e2b).await.unwrap();
    s.copy_sandbox_access("e", "f").await.unwrap();
    assert_eq!(s.sandbox_access("f").await.unwrap(), Some(e2b));
    // A public source with no token gives a public copy with none.
    s.copy_sandbox_access("public", "c").await.unwrap();
    assert_eq!(s.sandbox_access("c").await.unwrap(), None);
}

store_tests!(access_rules_are_kept_hashed_and_copied_to_forks);
