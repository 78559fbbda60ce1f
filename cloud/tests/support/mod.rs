pub mod serverless_stand_in;
pub mod moto;
pub mod sink;
