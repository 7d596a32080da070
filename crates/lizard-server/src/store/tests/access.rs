//! Private sandbox URLs' access rules.

use super::harness::TestDb;
use super::store_tests;

async fn access_rules_are_kept_hashed_and_copied_to_forks(db: TestDb) {
    let s = db.open().await;
    assert_eq!(s.sandbox_access("a").await.unwrap(), None);
    s.set_sandbox_access("a", &[1, 2, 3]).await.unwrap();
    assert_eq!(s.sandbox_access("a").await.unwrap(), Some(vec![1, 2, 3]));
    s.copy_sandbox_access("a", "b").await.unwrap();
    assert_eq!(s.sandbox_access("b").await.unwrap(), Some(vec![1, 2, 3]));
    // A public source gives a public copy.
    s.copy_sandbox_access("public", "c").await.unwrap();
    assert_eq!(s.sandbox_access("c").await.unwrap(), None);
}

store_tests!(access_rules_are_kept_hashed_and_copied_to_forks);
