//! The one reader of CustomResourceDefinitions: every place that needs a release's CRDs (the
//! manifest set the agent applies, `fleetgate validate`, `release create`, snapshots of live
//! CRDs) converts them here, so a CRD that cannot be read is an error everywhere instead of being
//! dropped by one reader and applied by another.

use super::{ManifestError, Source};
use crate::model::{is_crd, parse_multi};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::discovery::Scope;
use serde_json::Value;
use std::collections::BTreeMap;

/// `object` (a whole CRD document, or a live CRD) as the typed `apiextensions.k8s.io/v1` CRD.
pub fn typed_crd(object: &Value) -> Result<CustomResourceDefinition, String> {
    serde_json::from_value(object.clone())
        .map_err(|e| format!("not a valid apiextensions.k8s.io/v1 CustomResourceDefinition: {e}"))
}

/// The names a CustomResourceDefinition defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdNames {
    /// The CRD's own name (`<plural>.<group>`).
    pub name: String,
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub scope: Scope,
    /// Served versions, in the CRD's order.
    pub versions: Vec<String>,
}

impl CrdNames {
    pub fn of(crd: &CustomResourceDefinition) -> CrdNames {
        CrdNames {
            name: crd.metadata.name.clone().unwrap_or_default(),
            group: crd.spec.group.clone(),
            kind: crd.spec.names.kind.clone(),
            plural: crd.spec.names.plural.clone(),
            scope: if crd.spec.scope == "Cluster" { Scope::Cluster } else { Scope::Namespaced },
            versions: crd.spec.versions.iter().filter(|v| v.served).map(|v| v.name.clone()).collect(),
        }
    }
}

/// A CRD of a release's files, with the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct FileCrd {
    pub file: String,
    pub crd: CustomResourceDefinition,
}

/// The CRDs among a release's manifest files (path → bytes), in path and document order.
///
/// Files that are not UTF-8 or not YAML are skipped: they cannot be applied either, and the
/// mapping check reports them with their line. A document that says it is a CRD but does not
/// convert is an error, never skipped.
pub fn crds_in_files(files: &BTreeMap<String, Vec<u8>>) -> Result<Vec<FileCrd>, ManifestError> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (path, bytes) in files {
        let Ok(text) = std::str::from_utf8(bytes) else { continue };
        let Ok(docs) = parse_multi(path, text) else { continue };
        for (i, doc) in docs.iter().enumerate() {
            let field = |k: &str| doc.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            if !is_crd(&field("apiVersion"), &field("kind")) {
                continue;
            }
            let at = Source { file: path.clone(), document: i + 1 };
            match typed_crd(doc) {
                Ok(crd) => out.push(FileCrd { file: path.clone(), crd }),
                Err(reason) => errors.push(ManifestError::InvalidCrd { at, reason }),
            }
        }
    }
    match ManifestError::from_all(errors) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: things.example.com}\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {kind: Thing, plural: things}\n  versions:\n  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}\n  - {name: v0, served: false, storage: false}\n";

    fn files(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        entries.iter().map(|(p, t)| (p.to_string(), t.as_bytes().to_vec())).collect()
    }

    #[test]
    fn reads_crds_and_their_names() {
        let got =
            crds_in_files(&files(&[("a.yaml", &format!("kind: ConfigMap\n---\n{CRD}")), ("b.yaml", "x: [")])).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].file, "a.yaml");
        let names = CrdNames::of(&got[0].crd);
        assert_eq!((names.kind.as_str(), names.plural.as_str(), names.scope), ("Thing", "things", Scope::Namespaced));
        assert_eq!(names.versions, ["v1"]);
    }

    #[test]
    fn a_crd_that_does_not_convert_is_an_error_not_skipped() {
        let broken = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: x.example.com}\nspec: {group: 7}\n";
        let err = crds_in_files(&files(&[("crd.yaml", broken)])).unwrap_err();
        assert!(matches!(err, ManifestError::InvalidCrd { ref at, .. } if at.file == "crd.yaml"), "{err}");
    }

    #[test]
    fn a_kind_named_like_a_crd_in_another_group_is_not_one() {
        let other = CRD.replace("apiextensions.k8s.io/v1", "example.com/v1");
        assert!(crds_in_files(&files(&[("x.yaml", &other)])).unwrap().is_empty());
    }
}
