//! placeholder
use super::Recipe;
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RecipeError(pub String);
pub fn parse_str(_text: &str, _origin: &str, _overrides: &[String]) -> Result<Recipe, RecipeError> {
    Err(RecipeError("unimplemented".into()))
}
pub fn load_file(_path: &std::path::Path, _overrides: &[String]) -> Result<Recipe, RecipeError> {
    Err(RecipeError("unimplemented".into()))
}
