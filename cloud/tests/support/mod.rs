pub mod serverless_stand_in;
