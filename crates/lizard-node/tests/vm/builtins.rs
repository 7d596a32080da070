//! The built-in templates as the reference names them: `base` is Debian with Node.js 26
//! (and Python 3.14, as the announcement says), `code-interpreter-v1` adds pip and venv.
//! Both are built by the same builder as pushed templates (their steps in a build VM).

#![allow(clippy::unwrap_used)]

use crate::common;

use common::sh;
use lizard_api::CreateSandboxRequest;

fn from(template: &str) -> CreateSandboxRequest {
    CreateSandboxRequest { template: template.into(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread")]
async fn base_has_node_26_and_python_3_14() {
    let t = common::node().await;
    let s = t.node.create(from("base")).await.unwrap();
    let r = s.exec_collect(sh("node --version; npm --version; python3 --version; command -v node")).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "v26.10.0", "{r:?}");
    assert!(lines[1].starts_with("11."), "npm 11: {r:?}");
    assert!(lines[2].starts_with("Python 3.14."), "{r:?}");
    assert_eq!(lines[3], "/usr/local/bin/node", "Debian's node is gone: {r:?}");
    // Debian's nodejs only fetched Node.js 26: it is not installed any more.
    let r = s.exec_collect(sh("dpkg-query -W nodejs npm 2>&1; test ! -e /usr/bin/node")).await.unwrap();
    assert_eq!(r.exit_code, 0, "Debian's nodejs/npm are still there: {r:?}");
    // npm installs global packages with Node 26 (offline: a local package).
    let r = s
        .exec_collect(sh("mkdir -p /tmp/p && cd /tmp/p && echo '{\"name\":\"p\",\"version\":\"1.0.0\",\"bin\":{\"p\":\"p.js\"}}' > package.json \
             && printf '#!/usr/bin/env node\\nconsole.log(process.version)\\n' > p.js && npm install --global --offline --no-fund --no-audit . >/dev/null && p"))
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stdout.trim()), (0, "v26.10.0"), "{r:?}");
    // The account E2B's code runs as: uid 1000, its home, root by sudo without a password
    // and without a word on stderr (the hosts file names the guest's host); the API's
    // own default stays root.
    let mut as_user = sh("id -u; echo $HOME; sudo -n id -u");
    as_user.user = Some("user".into());
    let r = s.exec_collect(as_user).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_str(), r.stderr.as_str()), (0, "1000\n/home/user\n0\n", ""), "{r:?}");
    assert_eq!(s.exec_collect(sh("id -u")).await.unwrap().stdout, "0\n");
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn code_interpreter_has_python_3_14_with_pip_and_venv() {
    let t = common::node().await;
    let s = t.node.create(from("code-interpreter-v1")).await.unwrap();
    let r = s
        .exec_collect(sh("python --version && python3 -m pip --version && python3 -m venv /tmp/v && /tmp/v/bin/python -c 'import sys; print(sys.version_info[:2])' && node --version"))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert!(r.stdout.starts_with("Python 3.14."), "{r:?}");
    assert!(r.stdout.contains("(3, 14)"), "{r:?}");
    assert!(r.stdout.trim_end().ends_with("v26.10.0"), "{r:?}");
    // pip may install into the system Python: Debian's PEP 668 marker is gone.
    let r = s.exec_collect(sh("ls /usr/lib/python3*/EXTERNALLY-MANAGED 2>/dev/null; echo marker=$?")).await.unwrap();
    assert!(r.stdout.contains("marker=2"), "the EXTERNALLY-MANAGED marker is back: {r:?}");
    t.finish().await;
}
